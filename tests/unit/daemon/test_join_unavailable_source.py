"""A joiner catching up (``Joiner._catch_up``) beside a record that claims its stage far ahead and serves no step.

The most advanced record is asked first at every poll; a peer whose record claims the stage a million iterations
on but answers ``unavailable`` (``tests/adversarial/test_state.py``'s Mallory) was asked and logged 10-20 times a
second for as long as the catch-up polled. Once it answered ``unavailable`` it is skipped for the rest of that
catch-up, and the steps come from the honest replica as the stage takes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.steps_wire import LoggedStep, encode_steps
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import RemoteError
from tests.unit.daemon.fakes import PA, pid

RUN = "c6ef4b574eecf45a"
STAGE = 2
FROM, UNTIL = 10, 13
CLAIMER = pid("Ahead")


class View:
    run_id = RUN

    def __init__(self) -> None:
        self.records = {p: NodeRecord(run_id=RUN, peer_id=p, role="relay", stage=STAGE, state="online", iteration=i)
                        for p, i in ((PA, FROM), (CLAIMER, 10**6))}

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]


class Stage:
    """The honest replica takes one step per step-log request; the claimer serves none."""

    def __init__(self) -> None:
        self.at = FROM
        self.asked: list[str] = []

    async def fetch_state(self, peer: str, stage: int, *, timeout_s: float,
                          since_iteration: int | None = None) -> SimpleNamespace:
        self.asked.append(peer)
        if peer == CLAIMER:
            raise RemoteError(f"no state for stage {stage} here", peer, kind="unavailable")
        self.at += 1
        steps = [LoggedStep(i, torch.zeros(2), 1, f"hash-{i + 1}") for i in range(since_iteration or 0, self.at)]
        return SimpleNamespace(data=encode_steps(steps), iteration=self.at)


class Part:
    numel = 2

    def apply_mean(self, mean: torch.Tensor, count: int, *, total_sq_norm: float | None = None) -> Any:
        self.steps = getattr(self, "steps", FROM) + 1
        return SimpleNamespace(state_hash=f"hash-{self.steps}")


class Compute:
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def test_a_source_that_serves_no_steps_is_asked_once_per_catch_up() -> None:
    stage = Stage()
    joiner = Joiner(pid("New"), STAGE, Part(), view=View(), transport=stage, compute=Compute(), answers=AnswerBox(),
                    events=Events(), checkpoint_dir="", verify_states=False,
                    timings=Timings(step_poll_s=0.001, reserved_wait_s=5.0))
    caught = asyncio.run(asyncio.wait_for(joiner._catch_up(FROM, until=UNTIL), 10.0))
    assert caught == UNTIL and joiner.replayed_steps == UNTIL - FROM
    assert stage.asked == [CLAIMER, PA, PA, PA], stage.asked
