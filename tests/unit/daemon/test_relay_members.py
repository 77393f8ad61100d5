"""A relay counts the microbatches of the data holders the iteration kept, whatever the timing.

The race (stop 26's CI, ``test_data_holder_crash_mid_iteration``): a data holder dies right after its
microbatches went out; some of them finish their whole round trip through the relays before the death
is noticed, so the relays' gradients held them while the data holders' part did not (stages 1 and 2
counted 5, the data holders 4). Here that timing is fixed, not hoped for: the dead holder's backwards
finish on a real stage replica before the iteration closes. The data holders' ``Closed`` names the
members their aggregation kept; the relay's contribution then counts those members' microbatches only.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import torch

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.datapath.iterations import Closing
from gwtfp2p.daemon.datapath.relay import RelayRole
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.wire import Closed
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.partition import split_model
from tests.unit.daemon.fakes import DA, DH
from tests.unit.daemon.test_iterations import Seen, Transport, View
from tests.unit.model.tiny import VOCAB, tiny_spec

T = 3
DEAD = DA  # the data holder that dies after its microbatches came back through this relay


class Path:
    """The part of ``RelayPath`` the role drives, over a real stage replica (calls run inline)."""

    def __init__(self, executor: StageExecutor) -> None:
        self.executor = executor

    async def count_only(self, data_holders: tuple[str, ...] | None) -> None:
        self.executor.count_only(data_holders)


def replica_after_the_race() -> tuple[StageExecutor, StageExecutor]:
    """A stage replica whose backwards of both holders' microbatches finished (the race's timing), and one
    that only ever saw the live holder's (what the step must equal)."""
    spec = tiny_spec("gpt2", 2)
    stage = split_model(build_from_spec(spec, VOCAB), 2).stages[0]
    raced, clean = StageExecutor(copy.deepcopy(stage), spec, 1), StageExecutor(copy.deepcopy(stage), spec, 1)
    for k in range(4):
        holder = DH if k % 2 == 0 else DEAD
        x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(k))
        g = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(10 + k))
        for executor in (raced, clean) if holder == DH else (raced,):
            executor.forward(f"{holder}/{T}/{k}", x)
            executor.backward(f"{holder}/{T}/{k}", g, holder)
    return raced, clean


def role_for(executor: StageExecutor, seen: set[int], events: list[dict[str, Any]]) -> tuple[RelayRole, Closing]:
    gate = IterationGate(T)
    closing = Closing(gate=gate, view=View({}), transport=Transport(set()), aggregator=Seen(seen),
                      progress=NodeProgress(), timings=Timings())
    role = RelayRole(Path(executor), closing=closing, clip=None, gate=gate, events=Events(events.append),  # type: ignore[arg-type]
                     poll_s=0.05)
    return role, closing


def test_a_dead_data_holders_microbatches_do_not_count_when_the_data_holders_left_it_out() -> None:
    raced, clean = replica_after_the_race()
    role, closing = role_for(raced, set(), [])

    async def scenario() -> dict[str, Any] | None:
        over = asyncio.ensure_future(role.until_over(T, asyncio.Event(), asyncio.Event()))
        await asyncio.sleep(0)
        assert not over.done()
        await closing.on_closed(Closed(iteration=T, data_holders=(DH,), microbatches=2))
        return await asyncio.wait_for(over, 5.0)

    assert asyncio.run(scenario()) == {}
    ours, theirs = raced.grad_contribution("r"), clean.grad_contribution("r")
    assert raced.count == 4 and ours.count == theirs.count == 2  # before the fix: 4, the race's "5 of 4"
    assert torch.equal(ours.grad_sum, theirs.grad_sum) and ours.bound == theirs.bound


def test_without_the_data_holders_message_every_microbatch_taken_counts() -> None:
    """A lost ``Closed`` (the iteration closed by a replica, no message within ``closed_poll_s``): nothing to
    tell the members by, so every microbatch this part took counts, as before."""
    raced, _ = replica_after_the_race()
    role, _ = role_for(raced, {T}, [])
    assert asyncio.run(role.until_over(T, asyncio.Event(), asyncio.Event())) == {}
    assert raced.grad_contribution("r").count == 4
