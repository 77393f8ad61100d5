"""Crash recovery of the data plane, upstream side: resend a kept output when its next hop is lost.

Every node that sends activations on (a data holder's head, every relay) keeps each output in a
``KeptTable`` until its gradient comes back. The next hop counts as lost when a liveness probe
fails: probes run when a backward deadline passes (adaptive, ``timeouts.py``), when the peer's
record expires or transfers to it fail (``PeerManager``), or at once when a downstream node
reports that its gradient could not reach it (``Lost``). Then this node asks the nodes downstream
of the lost hop which of the affected microbatches they still hold (``Where``/``Held``) and resends
each kept output to another replica of the lost stage, tagged ``lost``/``from`` and, if a live
node downstream holds the microbatch, ``rejoin`` and a ``then.<stage>`` hint naming it: the new
replica recomputes one hop and hands it to that holder, which answers with its gradient instead
of recomputing (``datapath.py``). With no holder it is a plain forward failure. A ``recovery``
event reports each resent microbatch when its gradient is back: kind, recomputed hops, extra time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.kept import KeptTable
from gwtfp2p.daemon.links import Ema
from gwtfp2p.daemon.recovery_wire import Held, Lost, RecoveryMessage, Where
from gwtfp2p.daemon.routing import Hop
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.timeouts import RoundTripModel, backward_deadline_s, query_timeout_s
from gwtfp2p.transport import MicrobatchId, TransferMeta

logger = logging.getLogger(__name__)
CHECK_S = 0.25
RETRY_NOBODY_S = 1.0  # a microbatch no replica took is offered again after this
RECOVERY_TAGS = ("lost", "from", "rejoin")
OtherHop = Callable[[TransferMeta, set[str]], Hop | None]
HeldHere = Callable[[str, tuple[MicrobatchId, ...]], list[MicrobatchId]]


class Network(Protocol):
    """What recovery needs from the node's peer management (``PeerManager``)."""

    def is_dead(self, peer: str) -> bool: ...
    async def alive(self, peer: str) -> bool: ...
    def suspect(self, peer: str) -> None: ...
    def candidates(self, stages: set[int]) -> list[str]: ...
    def rtt(self, peer: str) -> float | None: ...
    def round_trip_model(self, peer: str, hops: int, queue_depth: int) -> RoundTripModel: ...
    async def send_recovery(self, peer: str, message: RecoveryMessage) -> bool: ...


@dataclass
class _Query:
    """Answers to ``Where`` about one lost peer: key -> (distance downstream, holder)."""

    waiting: set[str]
    claims: dict[str, tuple[int, str]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def claim(self, key: str, distance: int, holder: str) -> None:
        if key not in self.claims or distance < self.claims[key][0]:
            self.claims[key] = (distance, holder)

    def answered(self, peer: str) -> None:
        self.waiting.discard(peer)
        if not self.waiting:
            self.done.set()


class Upstream:
    """The kept outputs of one node (stage ``stage``; 0 for a data holder's head) and their recovery."""

    def __init__(self, self_id: str, stage: int, n_stages: int, sender: Sender, other_hop: OtherHop) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.sender = sender
        self.other_hop = other_hop
        self.table = KeptTable()
        self.round_trip = Ema(0.2)
        self.network: Network | None = None
        self.events: Events | None = None
        self.held_here: HeldHere = lambda _lost, _mbs: []
        self.background = Background(f"recovery of stage {stage}")
        self._queries: dict[str, _Query] = {}
        self.resends = 0
        self.lost_stage = 0 if stage == n_stages else stage + 1  # the stage of our next hops

    # -- sending and completing ----------------------------------------------------------------
    def _deadline(self, hop: Hop | None) -> tuple[float, float]:
        """(backward deadline, expected round trip) of a microbatch handed to ``hop``."""
        hops = self.n_stages - self.stage + 1
        model = (self.network.round_trip_model(hop.peer if hop else "", hops, len(self.table))
                 if self.network is not None else RoundTripModel(hops, 0.0, 0.0, 1))
        return backward_deadline_s(self.round_trip.value, model), max(self.round_trip.get(), model.expected_s())

    async def send(self, meta: TransferMeta, output: torch.Tensor, hop: Hop | None) -> Hop | None:
        """Send ``output`` to ``hop`` (failing over to other replicas) and keep it until its gradient is back."""
        key = meta.microbatch.key
        wait_s, expected_s = self._deadline(hop)
        kept = self.table.add(key, meta, output, hop, time.monotonic(), wait_s, expected_s)
        kept.busy = True
        try:
            took = await self.sender.forward_with_failover(hop, meta, output, lambda tried: self.other_hop(meta, tried))
        finally:
            kept.busy = False
        kept.hop = took
        if took is None:
            kept.deadline_at = time.monotonic() + RETRY_NOBODY_S
        return took

    def backward_arrived(self, key: str, meta: TransferMeta) -> bool:
        """The gradient of ``key`` is here: free the kept output; False if nothing was kept."""
        done = self.table.complete(key, time.monotonic())
        if done is None:
            return False
        if not done.resent:
            self.round_trip.add(done.round_trip_s)
        elif self.events is not None:
            rc = meta.tags.get("rc", 1)
            self.events.emit("recovery", kind=done.kind, microbatch=key, stage=self.stage, lost=done.lost,
                             recomputed_hops=rc if isinstance(rc, int) else 1, extra_s=round(done.extra_s, 4),
                             detect_s=None if done.detect_s is None else round(done.detect_s, 4),
                             round_trip_s=round(done.round_trip_s, 4))
        return True

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def drop(self, keys: list[str]) -> None:
        gone = set(keys)
        self.table.drop(lambda k, _e: k not in gone)

    def drop_through(self, iteration: int) -> None:
        """Forget outputs of ``iteration`` and earlier (the part stepped: nothing comes back for them)."""
        self.table.drop(lambda _k, e: e.meta.microbatch.iteration > iteration)

    # -- detection -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Check deadlines every ``CHECK_S`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), CHECK_S)
            self._check(time.monotonic())

    def _check(self, now: float) -> None:
        by_peer: dict[str, list[str]] = {}
        for key, kept in self.table.due(now):
            kept.busy = True
            if kept.hop is None:
                self.background.spawn(self._retry(key), f"retry {key}")
            else:
                by_peer.setdefault(kept.hop.peer, []).append(key)
        for peer, keys in by_peer.items():
            self.background.spawn(self._probe(peer, keys), f"probe {peer}")

    async def _probe(self, peer: str, keys: list[str]) -> None:
        alive = self.network is None or await self.network.alive(peer)
        now = time.monotonic()
        for key in keys:
            kept = self.table.get(key)
            if kept is not None:
                kept.busy = False
                if alive:
                    self.table.extend(key, now)
        if alive:
            logger.debug("late gradients from %s (%d microbatches): it answers, waiting longer", peer, len(keys))
        else:
            await self.peer_dead(peer)

    async def _retry(self, key: str) -> None:
        kept = self.table.get(key)
        if kept is None:
            return
        try:
            took = await self.sender.forward_with_failover(self.other_hop(kept.meta, set()), kept.meta, kept.output,
                                                           lambda tried: self.other_hop(kept.meta, tried))
        finally:
            kept.busy = False
        kept.hop = took
        wait_s, _ = self._deadline(took)
        kept.deadline_at = time.monotonic() + (wait_s if took is not None else RETRY_NOBODY_S)

    # -- recovery ------------------------------------------------------------------------------
    async def peer_dead(self, peer: str, hints: dict[str, tuple[int, str]] | None = None) -> None:
        """``peer`` is gone: resend every output it took (and whose gradient is not back) elsewhere."""
        keys = self.table.via(peer)
        if not keys:
            return
        now = time.monotonic()
        for key in keys:
            self.table.entries[key].busy = True
            self.table.failed(key, now)
        try:
            claims = await self._locate(peer, keys, hints or {})
            await asyncio.gather(*(self._resend(key, peer, claims.get(key)) for key in keys))
        finally:
            for key in keys:
                kept = self.table.get(key)
                if kept is not None:
                    kept.busy = False

    def _distance(self, holder_stage: int) -> int:
        """Hops from the lost stage down to a holder of ``holder_stage`` (0: the tail, last)."""
        return (self.n_stages + 1 if holder_stage == 0 else holder_stage) - self.lost_stage

    async def _locate(self, lost: str, keys: list[str],
                      hints: dict[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
        """Ask the nodes downstream of ``lost`` which of ``keys`` they hold; the nearest holder of each."""
        mbs = tuple(self.table.entries[k].meta.microbatch for k in keys)
        stages = set(range(self.lost_stage + 1, self.n_stages + 1))
        network = self.network
        candidates = set(network.candidates(stages)) if network is not None else set()
        candidates |= {mb.data_holder for mb in mbs}
        candidates.discard(lost)
        query = _Query(waiting=set(candidates))
        for key, (distance, holder) in hints.items():
            query.claim(key, distance, holder)
        if self.self_id in candidates:
            self._claims(query, self.self_id, self.held_here(lost, mbs), 0)
        if not query.waiting or network is None:
            return query.claims
        self._queries[lost] = query
        try:
            for peer in list(query.waiting):
                self.background.spawn(self._ask(network, peer, Where(microbatches=mbs, lost=lost), query),
                                      f"where {peer}")
            timeout = query_timeout_s([network.rtt(p) for p in candidates])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(query.done.wait(), timeout)
        finally:
            self._queries.pop(lost, None)
        return query.claims

    @staticmethod
    async def _ask(network: Network, peer: str, where: Where, query: _Query) -> None:
        if not await network.send_recovery(peer, where):
            query.answered(peer)

    def _claims(self, query: _Query, holder: str, mbs: list[MicrobatchId] | tuple[MicrobatchId, ...],
                holder_stage: int) -> None:
        for mb in mbs:
            if mb.key in self.table:
                query.claim(mb.key, self._distance(holder_stage), holder)
        query.answered(holder)

    async def _resend(self, key: str, lost: str, claim: tuple[int, str] | None) -> None:
        kept = self.table.get(key)
        if kept is None:
            return
        tags = {k: v for k, v in kept.meta.tags.items() if k not in RECOVERY_TAGS and not k.startswith("then.")}
        tags.update({"lost": lost, "from": self.self_id})
        holder = ""
        if claim is not None:
            distance, holder = claim
            tags["rejoin"] = True
            holder_stage = self.lost_stage + distance
            if holder_stage <= self.n_stages:
                tags[f"then.{holder_stage}"] = holder
        meta = kept.meta.model_copy(update={"tags": tags, "attempt": min(kept.meta.attempt + 1, 1000)})
        exclude = {lost}
        took = await self.sender.forward_with_failover(self.other_hop(meta, set(exclude)), meta, kept.output,
                                                       lambda tried: self.other_hop(meta, tried | exclude))
        kind = "backward_resend" if holder else "forward_resend"
        wait_s, _ = self._deadline(took)
        self.table.resent(key, meta, took, lost, kind, time.monotonic(), wait_s if took else RETRY_NOBODY_S)
        kept.hint = holder
        self.resends += 1
        logger.info("%s of %s (lost %s) -> %s%s", kind, key, lost, took.peer if took else "nobody yet",
                    f", rejoining {holder}" if holder else "")

    async def redirect(self, key: str, hop: Hop, tags: dict) -> None:
        """Our upstream resent ``key`` to us to rejoin ``hop`` (a node downstream that still holds it),
        but we had sent it elsewhere: send our kept output there (nothing recomputed)."""
        kept = self.table.get(key)
        if kept is None or kept.busy or (kept.hop is not None and kept.hop.peer == hop.peer):
            return
        kept.busy = True
        try:
            recovery = {k: v for k, v in tags.items() if k in RECOVERY_TAGS or k.startswith("then.")}
            meta = kept.meta.model_copy(update={"tags": {**kept.meta.tags, **recovery}})
            took = await self.sender.forward_with_failover(hop, meta, kept.output, lambda _tried: None)
        finally:
            kept.busy = False
        if took is not None:
            kept.meta, kept.hop = meta, took
            logger.info("redirected %s to %s", key, took.peer)

    # -- messages ------------------------------------------------------------------------------
    async def on_message(self, sender: str, message: RecoveryMessage) -> None:
        if isinstance(message, Where):
            held = self.held_here(message.lost, message.microbatches)
            if self.network is not None:
                await self.network.send_recovery(sender, Held(microbatches=tuple(held), lost=message.lost,
                                                              stage=self.stage))
        elif isinstance(message, Held):
            query = self._queries.get(message.lost)
            if query is not None and sender in query.waiting:
                self._claims(query, sender, message.microbatches, message.stage)
        elif isinstance(message, Lost):
            await self._on_lost(sender, message)

    async def _on_lost(self, sender: str, message: Lost) -> None:
        """``sender`` holds ``message.microbatch`` but its gradient cannot reach ``message.lost``."""
        key = message.microbatch.key
        kept = self.table.get(key)
        if kept is None:
            return
        claim = (self._distance(message.stage), sender)
        if self.network is not None:
            self.network.suspect(message.lost)
        query = self._queries.get(message.lost)
        if query is not None:
            query.claim(key, *claim)
        elif kept.hop is not None and kept.hop.peer == message.lost and not kept.busy:
            await self.peer_dead(message.lost, {key: claim})
        elif kept.lost == message.lost and kept.hint != sender and not kept.busy:
            kept.busy = True  # resent before the holder was known: resend once more, to rejoin it
            try:
                await self._resend(key, message.lost, claim)
            finally:
                kept.busy = False

    async def close(self) -> None:
        await self.background.close()


async def report_lost(network: Network | None, local: Upstream, meta: TransferMeta, lost: str, stage: int) -> bool:
    """Our gradient for ``meta.microbatch`` cannot reach ``lost`` (its previous hop here): tell the
    nearest live hop upstream of it on the recorded path, which keeps the output it sent to ``lost``
    (walking further up past dead ones). ``local`` handles the case where that hop is this node."""
    if network is None:
        return False
    network.suspect(lost)
    path = meta.path
    if lost not in path:
        return False
    index = len(path) - 1 - path[::-1].index(lost)
    for j in range(index - 1, -1, -1):
        message = Lost(microbatch=meta.microbatch, lost=path[j + 1], stage=stage)
        if path[j] == local.self_id:
            await local.on_message(local.self_id, message)
            return True
        if await network.send_recovery(path[j], message):
            return True
    logger.warning("nobody upstream of %s is left for %s", lost, meta.microbatch.key)
    return False
