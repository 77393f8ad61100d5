"""Stand-ins for the daemon's collaborators in unit tests: a clock, a sender, the swarm, a pinger.

Everything is in memory and deterministic; time moves only when a test advances the ``FakeClock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.timeouts import RoundTripModel
from gwtfp2p.daemon.wire import Held, Where
from gwtfp2p.transport import Ack, MicrobatchId, PeerTimeout, PeerUnreachable, PingResult, RemoteError, TransferMeta


def pid(name: str) -> str:
    return "12D3KooW" + name.ljust(10, "x")


DH, U, PA, PB, DA, DB, T = (pid(n) for n in ("Dh", "U", "Pa", "Pb", "Da", "Db", "T"))


def mb(index: int, holder: str = DH, iteration: int = 3) -> MicrobatchId:
    return MicrobatchId(data_holder=holder, iteration=iteration, index=index)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeSender:
    """Forwards: ``refuse`` peers do not take them (failover goes on); backwards: ``unreachable`` peers fail."""

    refuse: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    sent: list[tuple[Hop | None, TransferMeta]] = field(default_factory=list)
    backwards: list[tuple[str, TransferMeta, Any]] = field(default_factory=list)

    async def forward_with_failover(self, hop: Hop | None, meta: TransferMeta, tensor: Any,
                                    other: Callable[[set[str]], Hop | None]) -> Hop | None:
        tried: set[str] = set()
        while hop is not None and hop.peer in self.refuse:
            tried.add(hop.peer)
            hop = other(tried)
        self.sent.append((hop, meta))
        return hop

    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: Any) -> Ack | None:
        self.backwards.append((peer, meta, tensor))
        return None if peer in self.unreachable else Ack()


@dataclass
class FakeNetwork:
    """Peers by stage; ``holds`` answers ``Where`` (peer -> keys it holds); ``dead`` peers fail."""

    stages: dict[str, int]
    holds: dict[str, set[str]] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    recovery: Any = None
    messages: list[tuple[str, object]] = field(default_factory=list)
    suspected: list[str] = field(default_factory=list)
    tasks: list[asyncio.Future] = field(default_factory=list)  # recoveries started by ``exclude``
    excluded: list[tuple[str, str]] = field(default_factory=list)

    def is_dead(self, peer: str) -> bool:
        return peer in self.dead

    async def alive(self, peer: str) -> bool:
        return peer not in self.dead

    def suspect(self, peer: str) -> None:
        self.suspected.append(peer)

    def exclude(self, peer: str, reason: str) -> None:
        """Excluded for misbehaviour: dead for the recovery (the real one tells it through liveness)."""
        self.excluded.append((peer, reason))
        self.dead.add(peer)
        if self.recovery is not None:
            self.tasks.append(asyncio.ensure_future(self.recovery.peer_dead(peer)))

    def candidates(self, stages: set[int]) -> list[str]:
        return sorted(p for p, s in self.stages.items() if s in stages and p not in self.dead)

    def rtt(self, peer: str) -> float | None:
        return 0.001

    def round_trip_model(self, peer: str, hops: int, queue_depth: int) -> RoundTripModel:
        return RoundTripModel(hops, 0.001, 0.001, queue_depth)

    async def send_recovery(self, peer: str, message: object) -> bool:
        self.messages.append((peer, message))
        if peer in self.dead:
            return False
        if isinstance(message, Where) and self.recovery is not None:
            held = tuple(m for m in message.microbatches if m.key in self.holds.get(peer, set()))
            answer = Held(microbatches=held, lost=message.lost, stage=self.stages.get(peer, 0))
            asyncio.get_running_loop().call_soon(
                lambda: asyncio.ensure_future(self.recovery.on_message(peer, answer)))
        return True


@dataclass
class FakePinger:
    """Answers pings of peers not ``silent``; ``unreachable`` ones fail at once (a dial error)."""

    silent: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    silent_once: set[str] = field(default_factory=set)  # miss one ping (a stalled peer), then answer
    erroring: set[str] = field(default_factory=set)  # answer with an error
    pings: list[tuple[str, float]] = field(default_factory=list)
    rtt_s: float = 0.01

    async def ping(self, peer: str, *, timeout_s: float) -> PingResult:
        self.pings.append((peer, timeout_s))
        if peer in self.silent_once:
            self.silent_once.discard(peer)
            raise PeerTimeout(f"{peer} did not answer within {timeout_s} s")
        if peer in self.erroring:
            raise RemoteError(f"{peer} answered internal: overloaded", peer, "internal")
        if peer in self.unreachable:
            raise PeerUnreachable(f"cannot dial {peer}")
        if peer in self.silent:
            raise PeerTimeout(f"{peer} did not answer within {timeout_s} s")
        return PingResult(rtt_s=self.rtt_s, clock_offset_s=0.0)


class Prober:
    def __init__(self, dead: set[str] | None = None) -> None:
        self.dead = dead or set()
        self.asked: list[str] = []

    async def alive(self, peer: str) -> bool:
        self.asked.append(peer)
        return peer not in self.dead
