"""A joiner that read records lagging the swarm (``Joiner.join``): every record still at iteration 0, the
data holders' too, while the stage had stepped 26 times (a fast stage outruns records published once per
heartbeat). It keeps its initial weights as a fresh stage's, the replicas answer its notice of 0
*stale*, and it must then download their state, not replay every step since 0 (each logged step is a
gradient the size of the weights; ``tests/integration/test_churn_replay.py`` failed on it in CI, the
newcomer ready with ``state_source == "initial"``).

The view is a fake whose records stay at 0; the transport answers notices (stale before iteration 26),
serves the replicas' state of iteration 26, and records every state and step-log request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.wire import Member, MemberAnswer, decode_payload
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import PeerUnreachable
from tests.unit.daemon.fakes import PA, PB, pid

RUN = "c6ef4b574eecf45a"
HOLDER = pid("Hd")
STAGE = 2
STAGE_AT = 26  # the iteration the stage is in (its records still say 0)


def record(peer: str, stage: int) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage,
                      state="online", iteration=0)


class LaggingView:
    run_id = RUN

    def __init__(self) -> None:
        self.records = {p: record(p, s) for p, s in ((HOLDER, 0), (PA, STAGE), (PB, STAGE))}

    async def refresh(self) -> None:
        return None

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]

    def online(self, stage: int) -> list[str]:
        return [r.peer_id for r in self.by_stage(stage)]


class Replicas:
    """Answers each notice as a replica in iteration ``STAGE_AT`` would; serves its state; logs requests."""

    def __init__(self, box: AnswerBox) -> None:
        self.box = box
        self.downloads: list[str] = []
        self.replays: list[tuple[str, int]] = []

    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
        member = decode_payload(payload)
        if not isinstance(member, Member):
            raise AssertionError(f"unexpected message {member!r}")
        answer = MemberAnswer(stage=member.stage, from_iteration=member.from_iteration,
                              accepted=member.from_iteration >= STAGE_AT, receiver_iteration=STAGE_AT,
                              until_iteration=member.until_iteration)
        asyncio.get_running_loop().call_soon(self.box.on_answer, peer, answer)

    async def fetch_state(self, peer: str, stage: int, *, timeout_s: float,
                          since_iteration: int | None = None) -> SimpleNamespace:
        if since_iteration is not None:
            self.replays.append((peer, since_iteration))
            raise PeerUnreachable("no step log served in this test", peer)
        self.downloads.append(peer)
        return SimpleNamespace(data=b"state of 26", iteration=STAGE_AT)


class Part:
    numel = 4
    loaded = "initial weights"

    def load_state_bytes(self, data: bytes, expected_hash: str | None) -> str:
        self.loaded = "hash-of-26"
        return self.loaded

    def state_hash(self) -> str:
        return self.loaded


class Compute:
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:  # the compute thread's call, inline
        return fn(*args)


def test_a_joiner_that_took_the_initial_weights_on_lagging_records_downloads_when_told_stale() -> None:
    async def run() -> tuple[int, Joiner, Replicas]:
        box = AnswerBox()
        replicas = Replicas(box)
        joiner = Joiner(pid("New"), STAGE, Part(), view=LaggingView(), transport=replicas, compute=Compute(),
                        answers=box, events=Events(), checkpoint_dir="", verify_states=False,
                        timings=Timings(message_timeout_s=0.05))
        return await asyncio.wait_for(joiner.join(), 10.0), joiner, replicas

    first, joiner, replicas = asyncio.run(run())
    assert replicas.replays == [], "it replayed the steps since 0 instead of downloading"
    assert replicas.downloads == [PA] and joiner.source == "replica" and joiner.source_peer == PA
    assert first == STAGE_AT and joiner.state_iteration == STAGE_AT and joiner.replayed_steps == 0
    # What its record announces for step 25 until it steps 26 (test_state_check.py: a stage of two replicas)
    assert joiner.loaded_hash == "hash-of-26"
