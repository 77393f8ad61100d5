"""The two-replica output check with fakes: replicas that agree, a corrupting replica outvoted by two
others and excluded, a dispute between two replicas that nobody can decide, float noise tolerated."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from gwtfp2p.daemon.datapath.crosscheck import TOLERANCE, CrossCheck, verdict
from gwtfp2p.daemon.events import Events
from gwtfp2p.transport import Ack, TransferMeta
from tests.unit.daemon.fakes import DH, PA, PB, mb, pid

pytestmark = pytest.mark.timeout(30)
PC = pid("Pc")


class Stage:
    """A stage replica's executor: doubles its input (``liar``: plus noise)."""

    def __init__(self, liar: bool = False) -> None:
        self.liar = liar
        self.kept: set[str] = set()

    def forward(self, key: str, x: torch.Tensor) -> torch.Tensor:
        self.kept.add(key)
        return x * 2 + (torch.randn(x.shape) if self.liar else 0)

    def drop(self, key: str) -> bool:
        self.kept.discard(key)
        return True


class Inline:
    async def run(self, fn, *args):
        return fn(*args)


class Net:
    """Check requests and answers between in-memory CrossChecks."""

    def __init__(self) -> None:
        self.nodes: dict[str, CrossCheck] = {}

    def sender(self, me: str) -> object:
        net = self

        class Sender:
            async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
                node = net.nodes.get(peer)
                if node is None:
                    return None
                return node.on_request(me, meta, tensor) if kind == "forward" else node.on_answer(me, meta, tensor)

        return Sender()

    def add(self, me: str, executor: Stage | None, replicas: list[str], excluded: list, events: list) -> CrossCheck:
        check = CrossCheck(me, fraction=1.0, rng=random.Random(me), replicas=lambda: replicas, sender=self.sender(me),
                           compute=Inline(), executor=executor, exclude=lambda p, why: excluded.append((p, why)),
                           events=Events(events.append), timeout_s=5.0)
        self.nodes[me] = check
        return check


def run_check(liars: set[str], replicas: list[str]) -> tuple[str, list, list, dict[str, Stage]]:
    async def scenario() -> tuple[str, list, list, dict[str, Stage]]:
        net, excluded, events = Net(), [], []
        stages = {p: Stage(liar=p in liars) for p in replicas}
        for p in replicas:
            net.add(p, stages[p], [], [], [])
        holder = net.add(DH, None, replicas, excluded, events)
        meta = TransferMeta(microbatch=mb(0), stage=1, path=(DH,))
        result = await holder.check(meta, torch.ones(2, 4, 8), replicas[0])
        for node in net.nodes.values():
            await node.close()
        return result, excluded, events, stages

    return asyncio.run(scenario())


def test_honest_replicas_agree() -> None:
    result, excluded, events, stages = run_check(set(), [PA, PB, PC])
    assert result == "agree" and excluded == [] and events[-1]["verdict"] == "agree"
    assert all(not s.kept for s in stages.values())  # a check leaves no forward state behind


def test_a_corrupting_replica_is_outvoted_and_excluded() -> None:
    result, excluded, events, _ = run_check({PA}, [PA, PB, PC])
    assert result == "liar" and [p for p, _ in excluded] == [PA] and "differs" in excluded[0][1]
    assert events[-1]["liar"] == PA and len(events[-1]["peers"]) == 3


def test_two_replicas_that_disagree_are_a_dispute() -> None:
    result, excluded, _, _ = run_check({PA}, [PA, PB])
    assert result == "dispute" and excluded == []


def test_verdicts_tolerate_rounding_only() -> None:
    a = torch.randn(4, 8) * 10
    close = a + TOLERANCE / 10 * (1 + a.abs().max())
    far = a + 1e-2 * (1 + a.abs().max())
    assert verdict({PA: a, PB: close})[0] == "agree"
    assert verdict({PA: a, PB: close, PC: far})[:2] == ("liar", PC)
    assert verdict({PA: a, PB: a[:2]})[0] == "dispute"
    assert verdict({PA: a, PB: torch.full_like(a, float("nan"))})[0] == "dispute"
