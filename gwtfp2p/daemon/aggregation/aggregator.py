"""Replica aggregation: the live members of a part reduce their (gradient sum, count) and step alike.

Our own all-gather over the transport (hivemind's averager cannot keep replicas bit-identical,
docs/daemon.md): each member pushes its contribution to every member it expects; ``agreement`` settles
which ones the step uses; all reduce them sorted by peer id and take the same AdamW step, clipped by the
whole model's norm. Probes: ``settle``; who and what is taken: ``admission``; messages: ``wire.AggMessage``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.aggregation import admission as vet
from gwtfp2p.daemon.aggregation.agreement import RoundAgreement
from gwtfp2p.daemon.aggregation.encoding import WireContribution
from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome, Received, Round
from gwtfp2p.daemon.aggregation.settle import SettlePolicy
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import crashpoints
from gwtfp2p.daemon.wire import (
    CONTRIB,
    EMPTY,
    STARTING_UP,
    VIEW,
    WANT,
    AggMessage,
    WireError,
    decode_aggregation,
    encode_aggregation,
)
from gwtfp2p.transport import Ack, TransferMeta

logger = logging.getLogger(__name__)
CRASH_POINT = "exit_mid_aggregation"  # test fault: our contribution reached one member, not yet all
REFUSED_RETRIES = 20


class TensorSender(Protocol):
    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None: ...


class Aggregator:
    """The all-gather, agreement and step of one part (stage ``stage``; 0 for the data holders)."""

    def __init__(self, self_id: str, stage: int, members: MemberTable, state: PartState, *, compute: ComputeThread,
                 sender: TensorSender, prober: vet.Prober, online_peers: Callable[[], list[str]], events: Events,
                 timings: Timings, clock: Callable[[], float], admission: vet.Admission | None = None) -> None:
        self.self_id, self.stage, self.members, self.state = self_id, stage, members, state
        self.prober = prober  # the node's failure detector (which also tells us of deaths: ``peer_dead``)
        self.online_peers = online_peers  # online same-part peers in the DHT view
        self.events, self.timings, self.clock, self.compute, self.sender = events, timings, clock, compute, sender
        self.admission = admission  # None: every peer and contribution taken as it comes (unit tests)
        self.policy = SettlePolicy(timings)
        self.done_through = members.own.from_iteration - 1  # last iteration aggregated here
        self.active: int | None = None  # iteration being aggregated now
        self._rounds: dict[int, Round] = {}
        self._changed = asyncio.Event()
        self.background = Background(f"aggregation of stage {stage}")

    def _round(self, iteration: int) -> Round:
        rnd = self._rounds.get(iteration)
        if rnd is None:
            rnd = self._rounds[iteration] = Round(iteration, RoundAgreement(self.self_id))
            for peer in self.members.dead:
                rnd.agreement.peer_dead(peer)
        return rnd

    # -- receiving ------------------------------------------------------------------------------
    async def on_contribution(self, sender: str, meta: TransferMeta, tensor: torch.Tensor,
                              confirmed: bool = True) -> Ack:
        """Every aggregation message (``kind=grad``) of this part lands here (``confirmed``: False, a query whose
        death claims the guard could not confirm)."""
        if meta.stage != self.stage:
            return Ack(accepted=False, reason="not a contribution for this part")
        try:
            message = decode_aggregation(sender, meta)
        except WireError as e:
            return Ack(accepted=False, reason=str(e))
        if refusal := await vet.refusal_of(self.admission, self.state.codec, sender, message, tensor):
            return Ack(accepted=False, reason=refusal[:200])
        t = message.iteration
        if t <= self.done_through and t not in self._rounds:
            return Ack(accepted=False, reason=f"iteration {t} already aggregated here")
        rnd = self._round(t)
        if message.op == CONTRIB and message.origin in rnd.received:
            return Ack(duplicate=True)
        rnd.heard |= message.op == CONTRIB
        self._on_message(sender, rnd, message, tensor, confirmed)
        if rnd.own is not None and not rnd.held:  # while held, ``_settle`` drives once they are known
            self._drive(rnd)
        self._changed.set()
        return Ack()

    def _on_message(self, sender: str, rnd: Round, message: AggMessage, tensor: torch.Tensor, confirmed: bool) -> None:
        a, op = rnd.agreement, message.op
        if op == CONTRIB:
            contribution = WireContribution(message.origin, tensor.reshape(-1), message.count, message.bound)
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
        elif op == "query" and not confirmed:  # taken from the round's leader only, for this round only
            a.unconfirmed_query(sender, message.epoch, message.ids)
        elif op == "query":  # the inbox let it through once our own probes found those it names dead
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

    def fixed_through(self) -> int:
        """The last iteration whose members are fixed here: aggregated, or decided (notices for it are too late)."""
        return max([self.done_through, *(t for t, r in self._rounds.items() if r.agreement.decision is not None)])

    def round_of(self, iteration: int) -> Round | None:
        return self._rounds.get(iteration)

    def seen_iteration(self, iteration: int) -> bool:
        """Whether a member already sent us something for ``iteration`` (so it is closed)."""
        return (rnd := self._rounds.get(iteration)) is not None and rnd.heard

    # -- sending --------------------------------------------------------------------------------
    def _drive(self, rnd: Round) -> None:
        """Run the agreement and send what it says (also after the step: late askers get the decision)."""
        for send in rnd.agreement.progress():
            self._send(rnd, send.peer, AggMessage(send.op, rnd.iteration, send.ids, epoch=send.epoch))

    def _push(self, rnd: Round, peer: str, own: Received) -> None:
        view = rnd.pushed[peer] = rnd.agreement.views[self.self_id]
        self._send_contribution(rnd, peer, self.self_id, tuple(sorted(view)), own)

    def _send_contribution(self, rnd: Round, peer: str, origin: str, view: tuple[str, ...] = (),
                           received: Received | None = None) -> None:
        received = received or rnd.get(origin)
        if received is None:
            return
        c = received.contribution
        message = AggMessage(CONTRIB, rnd.iteration, view, origin=origin, count=c.count, bound=c.bound,
                             codec=self.state.codec.codec, tags=received.tags)
        self._send(rnd, peer, message, c.payload)

    def _send(self, rnd: Round, peer: str, message: AggMessage, tensor: torch.Tensor = EMPTY) -> None:
        meta = encode_aggregation(self.self_id, self.stage, message)
        self.background.spawn(self._deliver(rnd, peer, meta, tensor), f"{message.op} {rnd.iteration} to {peer}")

    async def _deliver(self, rnd: Round, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        """Send until acknowledged; a refusal is retried (``REFUSED_RETRIES`` times, and while the aggregation
        deadline lasts if the peer is still starting up: a joiner the replicas wait for may be joining), a failure
        probes the peer."""
        op, refusals, until = meta.tags.get("op"), 0, self.clock() + self.timings.aggregation_timeout_s
        while refusals < REFUSED_RETRIES:
            if peer in self.members.dead:
                return
            ack = await self.sender.send("forward", peer, meta, tensor)
            if ack is not None and (ack.accepted or ack.duplicate):
                if op == CONTRIB and "origin" not in meta.tags:
                    rnd.delivered += 1
                    if rnd.delivered == 1:
                        crashpoints.hit(CRASH_POINT, self.stage, rnd.iteration, self.events)
                return
            if (ack is None and not await self._probe(peer)) or self.done_through > rnd.iteration + 1:
                return
            refusals += not (ack is not None and ack.reason == STARTING_UP and self.clock() < until)
            await asyncio.sleep(self.timings.refused_retry_s)

    # -- liveness -------------------------------------------------------------------------------
    def peer_dead(self, peer: str, reason: str = "liveness probe") -> None:
        """``peer`` crashed: never expected again (until it announces itself anew); rounds go on without it."""
        if peer == self.self_id or peer in self.members.dead:
            return
        logger.warning("stage %d: %s is dead (%s); aggregating without it", self.stage, peer, reason)
        self.members.mark_dead(peer)
        for rnd in self._rounds.values():
            rnd.agreement.peer_dead(peer)
        self._changed.set()

    async def _probe(self, peer: str) -> bool:
        """Probe ``peer`` (once at a time); False, and it is dead for us, if it does not answer."""
        if not self.policy.probe_started(peer, self.clock()):
            return peer not in self.members.dead
        try:
            alive = await self.prober.alive(peer)
        finally:
            self.policy.probe_done(peer)
        if not alive:
            self.peer_dead(peer, "does not answer")
        return alive

    # -- the step -------------------------------------------------------------------------------
    async def gather(self, iteration: int, tags: dict[str, Any] | None = None) -> Gathered:
        """Push ours, agree on the contributions for ``iteration`` with the other members, reduce them."""
        started = self.clock()
        self.active, rnd = iteration, self._round(iteration)
        rnd.begun = started
        own = await self.compute.run(self.state.own_contribution, self.self_id)
        rnd.own = Received(own, await vet.signed_tags(self.admission, iteration, own, tags or {}))
        rnd.agreement.start(self.members.expected(iteration))
        decision = await self._settle(rnd, rnd.own)
        agreed = [r for r in map(rnd.get, decision) if r is not None]
        used, excluded = await self.compute.run(vet.screen_received, self.state.codec, agreed,
                                                self.state.screen_factor)
        vet.report_excluded(self.events, self.stage, iteration, excluded)
        mean, count, sq_norm = await self.compute.run(self.state.reduce, [r.contribution for r in used])
        every = {r.contribution.origin: r.tags for r in used}
        lost = rnd.agreement.expected - set(decision)
        return Gathered(iteration, decision, every, mean, count, sq_norm, rnd.agreement.how,
                        tuple(sorted(lost | set(excluded))), started, tuple(agreed), tuple(sorted(lost)))

    async def step(self, gathered: Gathered, total_sq_norm: float | None) -> Outcome:
        """The step on the gathered mean (clipped by ``total_sq_norm``, the whole model's, or else our own)."""
        t = gathered.iteration
        step = await self.compute.run(self.state.apply, gathered.mean, gathered.count, t, total_sq_norm)
        self.done_through, self.active = t, None
        for old in [i for i in self._rounds if i < t - 1]:
            del self._rounds[old]  # this round stays one more: late askers still get its decision and data
        return Outcome(step, gathered.members, gathered.tags, gathered.how, gathered.dropped,
                       self.clock() - gathered.started_at)

    def _sync(self, rnd: Round, own: Received) -> None:
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
                if rnd.pushed and not rnd.delivered and crashpoints.armed_at(CRASH_POINT, self.stage, t):
                    break  # test fault: the rest only after the first arrived (we die in between)
                self._push(rnd, peer, own)
            elif rnd.pushed[peer] != view and a.decision is None:
                rnd.pushed[peer] = view
                self._send(rnd, peer, AggMessage(VIEW, t, tuple(sorted(view))))

    async def _settle(self, rnd: Round, own: Received) -> tuple[str, ...]:
        a = rnd.agreement
        began = self.clock()
        deadline = began + self.timings.aggregation_timeout_s
        while True:
            self._sync(rnd, own)
            unannounced = self.policy.unannounced(self.online_peers(), self.members, self.members.dead)
            unannounced = self.policy.holding(unannounced, self.clock() - began)
            rnd.held = bool(unannounced)
            if not unannounced:
                self._drive(rnd)
            if a.decision is not None:
                return a.decision
            now = self.clock()
            for peer in self.policy.to_probe(a.waiting_on() + unannounced, now - began, now):
                self.background.spawn(self._probe(peer), f"probe {peer}")
            if now >= deadline:
                silent = a.waiting_on()
                logger.warning("stage %d iteration %d: no answer from %s within %.0f s; going on without them",
                               self.stage, rnd.iteration, silent, self.timings.aggregation_timeout_s)
                for peer in silent:
                    self.peer_dead(peer, "silent past the deadline")
                deadline = now + self.timings.aggregation_timeout_s
                continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(deadline - now, 0.25))

    def reset(self, from_iteration: int) -> None:
        """Re-synced (``resync``): aggregate from ``from_iteration``; rounds begun since are kept."""
        self.done_through, self.active = from_iteration - 1, None
        self._rounds = {t: rnd for t, rnd in self._rounds.items() if t >= from_iteration}

    async def close(self) -> None:
        await self.background.close()
