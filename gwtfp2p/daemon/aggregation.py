"""Replica aggregation: the live members of a part reduce their (gradient sum, count) and step alike.

Our own all-gather over the transport (hivemind's averager cannot guarantee per-iteration
bit-identical replicas, see HIVEMIND_NOTES.md): each member pushes its contribution for iteration
t to every member it expects, with the list it expects. Which contributions the step uses is
settled by ``agreement.py`` (no crash: at once; a member dead before its contribution reached
everyone: the union of what survivors hold, led by the lowest live id). Each member then reduces
the agreed contributions sorted by peer id and takes the same AdamW step
(``Trainable.apply_step``), so survivors stay bit-identical. A member that stays silent is probed
(ping): unreachable, or frozen with its DHT record expired, means dead; a last-resort deadline
bounds every wait. Messages: ``aggregation_wire.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gwtfp2p.daemon import crashpoints
from gwtfp2p.daemon.aggregation_wire import CONTRIB, EMPTY, GRAD_KIND, VIEW, WANT, AggMessage, WireError, decode, encode
from gwtfp2p.daemon.agreement import RoundAgreement, Send
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.steplog import StepLog, encode_steps
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.model.aggregate import GradContribution, mean_gradient
from gwtfp2p.model.trainable import StepResult, Trainable
from gwtfp2p.transport import Ack, PeerUnreachable, TransferMeta, TransportError

__all__ = ["GRAD_KIND", "Aggregator", "Outcome"]
logger = logging.getLogger(__name__)
REPLAY_STEPS = 4  # steps kept for joiners (each: one mean gradient of the part, on the CPU)
PROBE_AFTER_S = 0.5  # a member we wait for longer than this is pinged ...
PROBE_EVERY_S = 1.0  # ... at most this often
PING_TIMEOUT_S = 2.0
UNANNOUNCED_S = 10.0  # an online same-part peer that has not announced its membership is waited for this long
REFUSED_RETRIES, REFUSED_RETRY_S = 20, 0.5
CRASH_POINT = "exit_mid_aggregation"  # test fault: our contribution reached one member, not yet all


def _crash_armed(stage: int, iteration: int) -> bool:
    armed = crashpoints.ARMED
    return armed is not None and armed.matches(CRASH_POINT, stage, iteration)


@dataclass
class Received:
    contribution: GradContribution
    tags: dict[str, Any]


@dataclass
class Round:
    """Contributions of one iteration, the agreement on them, and to whom ours went."""

    iteration: int
    agreement: RoundAgreement
    received: dict[str, Received] = field(default_factory=dict)
    own: Received | None = None
    pushed: dict[str, frozenset[str]] = field(default_factory=dict)  # peer -> expected list our push carried
    delivered: int = 0
    heard: bool = False
    held: bool = False  # online same-part peers have not announced their membership: no decision yet

    def get(self, peer: str) -> Received | None:
        return self.own if peer == self.agreement.me else self.received.get(peer)


@dataclass(frozen=True)
class Outcome:
    step: StepResult
    members: tuple[str, ...]  # the agreed contributions, by member
    tags: dict[str, dict[str, Any]]  # every used member's tags (losses, tokens), ours included
    how: str = "fast"  # fast | leader | adopted
    dropped: tuple[str, ...] = ()  # expected members whose contribution was not used
    seconds: float = 0.0


class Aggregator:
    """The all-gather, agreement and step of one part (stage ``stage``; 0 for the data holders)."""

    def __init__(self, self_id: str, stage: int, members: MemberTable, part: Trainable, compute: ComputeThread,
                 sender: Sender, timeout_s: float = 60.0, events: Events | None = None,
                 replay_steps: int = REPLAY_STEPS) -> None:
        self.self_id = self_id
        self.stage = stage
        self.members = members
        self.part = part
        self.compute = compute
        self.sender = sender
        self.timeout_s = timeout_s
        self.events = events
        self.done_through = members.own.from_iteration - 1  # last iteration aggregated here
        self.active: int | None = None  # iteration being aggregated now
        self.last_hash = ""
        self.state_iteration = members.own.from_iteration  # steps in the part's state (compute thread)
        self.steps = StepLog(replay_steps)  # for joiners whose download fell behind (compute thread)
        self._rounds: dict[int, Round] = {}
        self._changed = asyncio.Event()
        self.background = Background(f"aggregation of stage {stage}")
        # Online same-part peers that have not told us their membership yet are waited for (their
        # notice comes when they discover us), except dead ones and those silent past UNANNOUNCED_S.
        self.online_peers: Callable[[], list[str]] = lambda: []
        self.listed: Callable[[str], bool] = lambda _peer: True  # the peer's DHT record is live
        # Liveness probe: True if the peer answers; the node may route it through its own failure
        # detector (which then calls ``peer_dead``). The default pings the peer itself.
        self.probe: Callable[[str], Awaitable[bool]] = self._ping
        self.ignored: set[str] = set()
        self._probing: set[str] = set()
        self._probed_at: dict[str, float] = {}

    def _round(self, iteration: int) -> Round:
        rnd = self._rounds.get(iteration)
        if rnd is None:
            rnd = self._rounds[iteration] = Round(iteration, RoundAgreement(self.self_id))
            for peer in self.members.dead:
                rnd.agreement.peer_dead(peer)
        return rnd

    def _wake(self) -> None:
        self._changed.set()

    # -- receiving ------------------------------------------------------------------------------
    async def on_contribution(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        """Every aggregation message (``kind=grad``) of this part lands here."""
        if meta.stage != self.stage:
            return Ack(accepted=False, reason="not a contribution for this part")
        try:
            message = decode(sender, meta, tensor, self.part.numel)
        except WireError as e:
            return Ack(accepted=False, reason=str(e))
        t = message.iteration
        if t <= self.done_through and t not in self._rounds:
            return Ack(accepted=False, reason=f"iteration {t} already aggregated here")
        rnd = self._round(t)
        if message.op == CONTRIB and message.origin in rnd.received:
            return Ack(duplicate=True)
        rnd.heard = True
        self._on_message(sender, rnd, message, tensor)
        if rnd.own is not None and not rnd.held:  # while held, ``_settle`` drives once they are known
            self._drive(rnd)
        self._wake()
        return Ack()

    def _on_message(self, sender: str, rnd: Round, message: AggMessage, tensor: torch.Tensor) -> None:
        a, op = rnd.agreement, message.op
        if op == CONTRIB:
            contribution = GradContribution(message.origin, tensor.reshape(-1), message.count)
            rnd.received[message.origin] = Received(contribution, message.tags or {})
            direct = message.origin == sender
            if direct:
                self._learn(rnd, (sender, *message.ids))
                if a.decision is not None and sender not in a.decision:
                    a.late_push(sender)
            a.contribution(message.origin, message.ids if direct else None)
        elif op == VIEW:
            self._learn(rnd, message.ids)
            a.update_view(sender, message.ids)
        elif op == "query":
            for peer in message.ids:
                self.peer_dead(peer, f"dead for {sender}")
            a.query(sender, message.epoch, message.ids)
        elif op == "report":
            a.report(sender, message.ids, message.epoch)
        elif op == "decided":
            a.decided(sender, message.ids)
        elif op == WANT:
            for origin in message.ids:
                if rnd.get(origin) is not None:
                    self._send_contribution(rnd, sender, origin)

    def _learn(self, rnd: Round, peers: tuple[str, ...]) -> None:
        for peer in peers:
            if peer != self.self_id and self.members.learn(peer, rnd.iteration):
                logger.info("stage %d: %s aggregates with us from iteration %d", self.stage, peer, rnd.iteration)

    def seen_iteration(self, iteration: int) -> bool:
        """Whether a member already sent us something for ``iteration`` (so it is closed)."""
        rnd = self._rounds.get(iteration)
        return rnd is not None and rnd.heard

    # -- sending --------------------------------------------------------------------------------
    def _drive(self, rnd: Round) -> None:
        """Run the agreement and send what it says (also after the step: late askers get the decision)."""
        for send in rnd.agreement.progress():
            self._send_agreement(rnd, send)

    def _send_agreement(self, rnd: Round, send: Send) -> None:
        self._send(rnd, send.peer, AggMessage(send.op, rnd.iteration, send.ids, epoch=send.epoch))

    def _push(self, rnd: Round, peer: str) -> None:
        assert rnd.own is not None
        view = rnd.agreement.views[self.self_id]
        rnd.pushed[peer] = view
        self._send_contribution(rnd, peer, self.self_id, tuple(sorted(view)))

    def _send_contribution(self, rnd: Round, peer: str, origin: str, view: tuple[str, ...] = ()) -> None:
        received = rnd.get(origin)
        assert received is not None
        c = received.contribution
        message = AggMessage(CONTRIB, rnd.iteration, view, origin=origin, count=c.count, tags=received.tags)
        self._send(rnd, peer, message, c.grad_sum)

    def _send(self, rnd: Round, peer: str, message: AggMessage, tensor: torch.Tensor = EMPTY) -> None:
        meta = encode(self.self_id, self.stage, message)
        self.background.spawn(self._deliver(rnd, peer, meta, tensor), f"{message.op} {rnd.iteration} to {peer}")

    async def _deliver(self, rnd: Round, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        """Send until acknowledged; a refusal (peer starting up) is retried, a failure probes the peer."""
        op = meta.tags.get("op")
        for _ in range(REFUSED_RETRIES):
            if peer in self.members.dead:
                return
            ack = await self.sender.send("forward", peer, meta, tensor)
            if ack is not None and (ack.accepted or ack.duplicate):
                if op == CONTRIB and "origin" not in meta.tags:
                    rnd.delivered += 1
                    if rnd.delivered == 1:
                        crashpoints.hit(CRASH_POINT, self.stage, rnd.iteration, self.events)
                return
            if ack is None and not await self._probe(peer):
                return
            if self.done_through > rnd.iteration + 1:
                return
            await asyncio.sleep(REFUSED_RETRY_S)

    # -- liveness -------------------------------------------------------------------------------
    def peer_dead(self, peer: str, reason: str = "") -> None:
        """``peer`` crashed: never expected again (until it announces itself anew); rounds go on without it."""
        if peer == self.self_id or peer in self.members.dead:
            return
        logger.warning("stage %d: %s is dead (%s); aggregating without it", self.stage, peer, reason or "?")
        self.members.mark_dead(peer)
        for rnd in self._rounds.values():
            rnd.agreement.peer_dead(peer)
        self._wake()

    async def _probe(self, peer: str) -> bool:
        """Probe ``peer`` (once at a time); False, and it is dead for us, if it does not answer."""
        if peer in self._probing:
            return peer not in self.members.dead
        self._probing.add(peer)
        self._probed_at[peer] = time.monotonic()
        try:
            alive = await self.probe(peer)
        finally:
            self._probing.discard(peer)
        if not alive:
            self.peer_dead(peer, "does not answer")
        return alive

    async def _ping(self, peer: str) -> bool:
        """Alive unless unreachable twice, or silent with its DHT record gone (frozen)."""
        for attempt in range(2):
            try:
                await self.sender.transport.ping(peer, timeout_s=PING_TIMEOUT_S)
                return True
            except PeerUnreachable:
                if attempt == 1:
                    return False
                await asyncio.sleep(0.2)
            except TransportError:
                return self.listed(peer)
        return True

    def _watch(self, peers: list[str]) -> None:
        now = time.monotonic()
        for peer in peers:
            if peer not in self._probing and now - self._probed_at.get(peer, 0.0) >= PROBE_EVERY_S:
                self.background.spawn(self._probe(peer), f"probe {peer}")

    def unannounced(self) -> list[str]:
        return [p for p in self.online_peers()
                if p not in self.members and p not in self.ignored and p not in self.members.dead]

    # -- the step -------------------------------------------------------------------------------
    async def aggregate(self, iteration: int, tags: dict[str, Any] | None = None) -> Outcome:
        """Push ours, agree on the contributions for ``iteration`` with the other members, reduce, step."""
        started = time.monotonic()
        self.active = iteration
        rnd = self._round(iteration)
        own = await self.compute.run(self._own_contribution)
        rnd.own = Received(own, dict(tags or {}))
        rnd.agreement.start(self.members.expected(iteration))
        decision = await self._settle(rnd)
        used = [rnd.get(p) for p in decision]
        step = await self.compute.run(self._apply, [r.contribution for r in used if r is not None], iteration)
        every = {p: r.tags for p, r in zip(decision, used, strict=True) if r is not None}
        self.done_through, self.active, self.last_hash = iteration, None, step.state_hash
        for old in [t for t in self._rounds if t < iteration - 1]:
            del self._rounds[old]  # this round stays one more: late askers still get its decision and data
        dropped = tuple(sorted(rnd.agreement.expected - set(decision)))
        return Outcome(step, decision, every, rnd.agreement.how, dropped, time.monotonic() - started)

    def _sync(self, rnd: Round) -> None:
        """Expected members from the table; absent ones (dead, or not members of this iteration) out;
        our contribution to every expected member, and our new list to those who got an older one."""
        a, t = rnd.agreement, rnd.iteration
        a.expect(self.members.expected(t))
        for peer in sorted(a.expected - a.dead - {self.self_id}):
            membership = self.members.get(peer)
            if membership is None or not membership.covers(t):
                a.peer_dead(peer)
        view = a.views[self.self_id]
        for peer in sorted(a.expected - a.dead - {self.self_id}):
            if peer not in rnd.pushed:
                if rnd.pushed and not rnd.delivered and _crash_armed(self.stage, t):
                    break  # test fault: the rest only after the first arrived (we die in between)
                self._push(rnd, peer)
            elif rnd.pushed[peer] != view and a.decision is None:
                rnd.pushed[peer] = view
                self._send(rnd, peer, AggMessage(VIEW, t, tuple(sorted(view))))

    async def _settle(self, rnd: Round) -> tuple[str, ...]:
        a = rnd.agreement
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + self.timeout_s
        while True:
            self._sync(rnd)
            unannounced = self.unannounced()
            if unannounced and loop.time() - began > UNANNOUNCED_S:
                self.ignored.update(unannounced)
                unannounced = []
            rnd.held = bool(unannounced)
            if not unannounced:
                self._drive(rnd)
            if a.decision is not None:
                return a.decision
            now = loop.time()
            if now - began >= PROBE_AFTER_S:
                self._watch(a.waiting_on() + unannounced)
            if now >= deadline:
                silent = a.waiting_on()
                logger.warning("stage %d iteration %d: no answer from %s within %.0f s; going on without them",
                               self.stage, rnd.iteration, silent, self.timeout_s)
                for peer in silent:
                    self.peer_dead(peer, "silent past the deadline")
                deadline = now + self.timeout_s
                continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(deadline - now, 0.25))

    def _own_contribution(self) -> GradContribution:
        """On the compute thread: ours, on the CPU (the transport sends CPU tensors; every member then
        reduces CPU tensors alike, whatever its device)."""
        own = self.part.grad_contribution(self.self_id)
        return GradContribution(own.replica_id, own.grad_sum.cpu(), own.count)

    def _apply(self, contributions: list[GradContribution], iteration: int) -> StepResult:
        """On the compute thread: the step, and the state's iteration with it (read by ``state``)."""
        step = self.part.apply_step(contributions)
        if self.steps.capacity > 0:  # the same reduction again (same bits), kept for joiners to replay
            mean, count = mean_gradient(contributions, numel=self.part.numel, dtype=self.part.grad_dtype)
            self.steps.record(iteration, mean, count, step.state_hash)
        self.state_iteration = iteration + 1
        return step

    def state(self) -> tuple[int, bytes]:
        """On the compute thread: (iteration, state bytes), consistent with each other."""
        return self.state_iteration, self.part.state_bytes()

    def steps_since(self, iteration: int) -> tuple[int, bytes] | None:
        """On the compute thread: (our iteration, the encoded steps from ``iteration`` on), or None
        if they are not all kept any more."""
        steps = self.steps.since(iteration)
        return None if steps is None else (self.state_iteration, encode_steps(steps))

    async def close(self) -> None:
        await self.background.close()
