"""Crash recovery of the data plane, upstream side: redo one hop when a next hop is lost.

The outbox keeps every output until its gradient is back. A next hop counts as lost when a liveness
probe fails: probes run when a backward deadline passes (checked here every ``deadline_check_s``), when
its record expires or transfers to it fail (the failure detector), or at once when a downstream node
reports that its gradient could not reach it (``Lost``). Then this node asks the nodes downstream of
the lost hop which of the affected microbatches they hold (``Where``/``Held``) and resends each kept
output to another replica of the lost stage, as ``resend`` plans it. Our own gradients that cannot
reach our previous hop are reported upstream (``report_lost``). A next hop that answers its probes but
delivers no gradient (``delivery``) is excluded while another replica of its stage lives, and its outputs
are resent as if it had died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.daemon.datapath import resend
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.resend import Claim, Claims, LostAction
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.daemon.wire import Held, Lost, Where
from gwtfp2p.daemon.wire import Recovery as RecoveryMessage
from gwtfp2p.transport import MicrobatchId, TransferMeta

logger = logging.getLogger(__name__)
HeldHere = Callable[[str, tuple[MicrobatchId, ...]], list[MicrobatchId]]


class Network(Protocol):
    """What recovery needs to know of the swarm (``swarm.directory.SwarmDirectory``)."""

    def is_dead(self, peer: str) -> bool: ...
    async def alive(self, peer: str) -> bool: ...
    def suspect(self, peer: str) -> None: ...
    def exclude(self, peer: str, reason: str) -> object: ...
    def candidates(self, stages: set[int]) -> list[str]: ...
    def rtt(self, peer: str) -> float | None: ...
    async def send_recovery(self, peer: str, message: RecoveryMessage) -> bool: ...


class Recovery:
    """Deadline checks, lost-hop recovery and recovery messages of one node's outbox."""

    def __init__(self, self_id: str, outbox: Outbox, *, network: Network, held_here: HeldHere, deadlines: Deadlines,
                 check_s: float) -> None:
        self.self_id = self_id
        self.outbox = outbox
        self.network = network
        self.held_here = held_here  # microbatches this node holds with a given peer on their path
        self.deadlines = deadlines
        self.check_s = check_s
        self.background = Background(f"recovery of stage {outbox.stage}")
        self._queries: dict[str, Claims] = {}
        self._answered: dict[str, asyncio.Event] = {}
        self.resends = 0

    # -- detection -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Check the outbox's deadlines every ``check_s`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.check_s)
            self.check()

    def check(self) -> None:
        """One pass: offer again what nobody took, probe the hops whose gradients are late."""
        nobody, by_peer = self.outbox.overdue()
        for key in nobody:
            self.background.spawn(self.outbox.retry(key), f"retry {key}")
        for peer, keys in by_peer.items():
            self.background.spawn(self._probe(peer, keys), f"probe {peer}")

    async def _probe(self, peer: str, keys: list[str]) -> None:
        alive = await self.network.alive(peer)
        self.outbox.probed(keys, alive)
        if alive and self._unproductive(peer, keys):
            waited = self.outbox.clock() - min(self.outbox.table.entries[k].sent_at for k in keys if k in self.outbox)
            self.network.exclude(peer, f"took {len(keys)} microbatch(es) and delivered no gradient in {waited:.1f} s "
                                       f"although it answers probes")  # its outputs are resent as for a death
        elif alive:
            logger.debug("late gradients from %s (%d microbatches): it answers, waiting longer", peer, len(keys))
        else:
            await self.peer_dead(peer)

    def _unproductive(self, peer: str, keys: list[str]) -> bool:
        """Whether ``peer`` answered enough probes about late outputs without delivering while another replica
        of its stage delivered since (else the stage is stuck as a whole, and excluding it would stall it)."""
        sent = [self.outbox.table.entries[k].sent_at for k in keys if k in self.outbox]
        deliveries = self.outbox.deliveries
        if not sent or not deliveries.answered_late(peer, min(sent)) or not self.outbox.next_stage:
            return False
        return any(p != peer and deliveries.delivered_since(p, min(sent))
                   for p in self.network.candidates({self.outbox.next_stage}))

    # -- recovery ------------------------------------------------------------------------------
    async def peer_dead(self, peer: str, hints: dict[str, Claim] | None = None) -> None:
        """``peer`` is gone: resend every output it took (and whose gradient is not back) elsewhere."""
        table = self.outbox.table
        keys = table.via(peer)
        if not keys:
            return
        now = self.outbox.clock()
        for key in keys:
            table.entries[key].busy = True
            table.failed(key, now)
        try:
            claims = await self._locate(peer, keys, hints or {})
            await asyncio.gather(*(self._resend(key, peer, claims.get(key)) for key in keys))
        finally:
            for key in keys:
                kept = table.get(key)
                if kept is not None:
                    kept.busy = False

    async def _locate(self, lost: str, keys: list[str], hints: dict[str, Claim]) -> dict[str, Claim]:
        """Ask the nodes downstream of ``lost`` which of ``keys`` they hold; the nearest holder of each."""
        mbs = tuple(self.outbox.table.entries[k].meta.microbatch for k in keys)
        outbox = self.outbox
        stages = set(range(outbox.next_stage + 1, outbox.n_stages + 1))
        candidates = set(self.network.candidates(stages)) | {mb.data_holder for mb in mbs}
        candidates.discard(lost)
        query, done = Claims(waiting=set(candidates)), asyncio.Event()
        for key, (hops, holder) in hints.items():
            query.claim(key, hops, holder)
        if self.self_id in candidates:
            self._claims(query, done, self.self_id, self.held_here(lost, mbs), 0)
        if not query.waiting:
            return query.claims
        self._queries[lost], self._answered[lost] = query, done
        try:
            for peer in list(query.waiting):
                self.background.spawn(self._ask(peer, Where(microbatches=mbs, lost=lost), query, done),
                                      f"where {peer}")
            timeout = self.deadlines.query_s([self.network.rtt(p) for p in candidates])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            self._queries.pop(lost, None)
            self._answered.pop(lost, None)
        return query.claims

    async def _ask(self, peer: str, where: Where, query: Claims, done: asyncio.Event) -> None:
        if not await self.network.send_recovery(peer, where) and query.answered(peer):
            done.set()

    def _claims(self, query: Claims, done: asyncio.Event, holder: str,
                mbs: list[MicrobatchId] | tuple[MicrobatchId, ...], holder_stage: int) -> None:
        hops = resend.distance(holder_stage, self.outbox.next_stage, self.outbox.n_stages)
        for mb in mbs:
            if mb.key in self.outbox:
                query.claim(mb.key, hops, holder)
        if query.answered(holder):
            done.set()

    async def _resend(self, key: str, lost: str, claim: Claim | None) -> None:
        outbox = self.outbox
        kept = outbox.get(key)
        if kept is None:
            return
        plan = resend.resend_meta(kept.meta, lost, self.self_id, claim, outbox.next_stage, outbox.n_stages)
        exclude = {lost}
        took = await outbox.send_kept(kept, outbox.other_hop(plan.meta, set(exclude)), plan.meta,
                                      lambda tried: outbox.other_hop(plan.meta, tried | exclude))
        wait_s, _ = outbox.deadline(took)
        outbox.table.resent(key, plan.meta, took, lost, plan.kind, outbox.clock(),
                            wait_s if took else outbox.retry_nobody_s)
        kept.hint = plan.holder
        self.resends += 1
        logger.info("%s of %s (lost %s) -> %s%s", plan.kind, key, lost, took.peer if took else "nobody yet",
                    f", rejoining {plan.holder}" if plan.holder else "")

    async def redirect(self, key: str, hop: Hop, tags: dict) -> None:
        """Our upstream resent ``key`` to us to rejoin ``hop`` (a node downstream that still holds it),
        but we had sent it elsewhere: send our kept output there (nothing recomputed)."""
        kept = self.outbox.get(key)
        if kept is None or kept.busy or (kept.hop is not None and kept.hop.peer == hop.peer):
            return
        kept.busy = True
        previous = kept.hop
        try:
            meta = resend.redirect_meta(kept.meta, tags)
            took = await self.outbox.send_kept(kept, hop, meta, lambda _tried: None)
        finally:
            kept.busy = False
        if took is not None:
            kept.meta = meta
            logger.info("redirected %s to %s", key, took.peer)
        else:
            kept.hop = previous

    # -- messages ------------------------------------------------------------------------------
    async def on_message(self, sender: str, message: RecoveryMessage) -> None:
        if isinstance(message, Where):
            held = self.held_here(message.lost, message.microbatches)
            await self.network.send_recovery(sender, Held(microbatches=tuple(held), lost=message.lost,
                                                          stage=self.outbox.stage))
        elif isinstance(message, Held):
            query = self._queries.get(message.lost)
            if query is not None and sender in query.waiting:
                self._claims(query, self._answered[message.lost], sender, message.microbatches, message.stage)
        elif isinstance(message, Lost):
            await self._on_lost(sender, message)

    async def _on_lost(self, sender: str, message: Lost) -> None:
        """``sender`` holds ``message.microbatch`` but its gradient cannot reach ``message.lost``."""
        key = message.microbatch.key
        kept = self.outbox.get(key)
        claim = (resend.distance(message.stage, self.outbox.next_stage, self.outbox.n_stages), sender)
        if kept is not None:
            self.network.suspect(message.lost)
        query = self._queries.get(message.lost)
        action = resend.on_lost(kept, message.lost, sender, query is not None)
        if action is LostAction.CLAIM and query is not None:
            query.claim(key, *claim)
        elif action is LostAction.RECOVER and not await self.network.alive(message.lost):
            await self.peer_dead(message.lost, {key: claim})
        elif action in (LostAction.RECOVER, LostAction.RESEND_AGAIN) and kept is not None:
            # RECOVER of a hop that answers our probe: a claim is evidence, not a verdict; only this
            # microbatch is redone (the hop keeps the others it holds: resending them too counted them twice).
            # RESEND_AGAIN: resent before the holder was known: resend once more, to rejoin it.
            kept.busy = True
            try:
                await self._resend(key, message.lost, claim)
            finally:
                kept.busy = False

    async def report_lost(self, meta: TransferMeta, lost: str, stage: int) -> bool:
        """Our gradient for ``meta.microbatch`` cannot reach ``lost`` (its previous hop here): tell the
        nearest live hop upstream of it on the recorded path, which keeps the output it sent to ``lost``
        (walking further up past dead ones); that hop may be this node (a data holder's own head)."""
        self.network.suspect(lost)
        for upstream, after in resend.report_chain(meta.path, lost):
            message = Lost(microbatch=meta.microbatch, lost=after, stage=stage)
            if upstream == self.self_id:
                await self.on_message(self.self_id, message)
                return True
            if await self.network.send_recovery(upstream, message):
                return True
        if lost in meta.path:
            logger.warning("nobody upstream of %s is left for %s", lost, meta.microbatch.key)
        return False

    async def close(self) -> None:
        await self.background.close()
