"""Outgoing tensor transfers with adaptive deadlines, bounded retries and measured timings.

The deadline of a transfer is a multiple of what the link should need (RTT + bytes / bandwidth,
from ``LinkTable``, + the emulated delay) with a floor, never one fixed number
(``timeouts.Deadlines.transfer_s``). The bytes are the transfer's own and those already in flight on
this node's one uplink, which it waits behind. Each successful transfer feeds the bandwidth estimate;
a timed-out one bounds it (a home uplink slower than the default estimate would else time out every
transfer that shares it, and never be measured). Retries
cover transient failures (a busy peer, a dropped stream); a peer that stays unreachable is reported
(``on_failure``: the failure detector probes it), and a forward fails over to another replica of the
next stage.
Each tensor travels in the run's wire codec for its kind (``RunSpec.forward_codec``/``backward_codec``;
aggregation messages carry contributions their aggregator encoded already); sizes, deadlines, bandwidth
figures and the ``Traffic`` counters are in wire bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import torch

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.daemon.wire import is_aggregation
from gwtfp2p.transport import Ack, PeerTimeout, PeerUnreachable, TransferMeta, Transport, TransportError
from gwtfp2p.transport.compression import WireCodecs, wire_nbytes

logger = logging.getLogger(__name__)


@dataclass
class Traffic:
    """Acknowledged transfers sent, and their wire bytes, by kind (a retried transfer counts once)."""

    forwards: int = 0
    forward_bytes: int = 0
    backwards: int = 0
    backward_bytes: int = 0
    aggregation_messages: int = 0
    aggregation_bytes: int = 0

    def add(self, kind: str, size_bytes: int) -> None:
        if kind == "aggregation":
            self.aggregation_messages += 1
            self.aggregation_bytes += size_bytes
        elif kind == "forward":
            self.forwards += 1
            self.forward_bytes += size_bytes
        else:
            self.backwards += 1
            self.backward_bytes += size_bytes

    def fields(self) -> dict[str, int]:
        return asdict(self)


def wire_codec(codecs: WireCodecs, kind: str, meta: TransferMeta) -> str:
    """The transport codec a ``kind`` (forward/backward) transfer of the run travels in: the run's for
    activations and gradients; ``none`` for aggregation messages (a contribution's aggregator encodes it
    under the run's ``aggregate`` codec itself, so that every replica decodes the same bytes)."""
    if is_aggregation(meta):
        return "none"
    return codecs.forward if kind == "forward" else codecs.backward


def codec_mismatch(codecs: WireCodecs, kind: str, meta: TransferMeta) -> str:
    """Why a received transfer must be refused for its codec ("" if it is the run's)."""
    expected = wire_codec(codecs, kind, meta)
    if meta.codec == expected:
        return ""
    what = "aggregation messages" if is_aggregation(meta) else f"{kind}s"
    return f"wire codec mismatch: this run sends {what} as {expected}, this one came as {meta.codec}"


class Sender:
    """Forward/backward/aggregation transfers of one node."""

    def __init__(self, transport: Transport, links: LinkTable, deadlines: Deadlines, timings: Timings,
                 on_failure: Callable[[str], None], codecs: WireCodecs) -> None:
        self.transport = transport
        self.links = links
        self.deadlines = deadlines
        self.retry_delays_s = timings.retry_delays_s
        self.unreachable_retry_delays_s = timings.unreachable_retry_delays_s
        self.on_failure = on_failure  # a peer that stayed unreachable
        self.codecs = codecs
        self.traffic = Traffic()
        self.in_flight_bytes = 0  # wire bytes of the transfers under way: they share this node's uplink

    @property
    def bytes_sent(self) -> int:
        """Wire bytes of every acknowledged transfer, all kinds."""
        t = self.traffic
        return t.forward_bytes + t.backward_bytes + t.aggregation_bytes

    def timeout_for(self, peer: str, size_bytes: int) -> float:
        emulated = self.transport.link.delay_s(peer, size_bytes) * 2 if self.transport.link else 0.0
        return self.deadlines.transfer_s(self.links.rtt(peer), size_bytes, self.links.bandwidth(peer), emulated)

    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
        """Send ``tensor`` (kind ``forward`` or ``backward``); the peer's ack, or None after retries."""
        codec = wire_codec(self.codecs, kind, meta)
        if meta.codec != codec:
            meta = meta.model_copy(update={"codec": codec})
        size = wire_nbytes(codec, tensor.dtype, tensor.numel())
        call = self.transport.forward if kind == "forward" else self.transport.backward
        attempt = 0
        while True:
            try:
                ack, queued, seconds = await self._attempt(call, peer, meta, tensor, size)
            except TransportError as e:
                delays = self.unreachable_retry_delays_s if isinstance(e, PeerUnreachable) else self.retry_delays_s
                logger.debug("%s of %s to %s failed (attempt %d): %s", kind, meta.microbatch.key, peer, attempt, e)
                if attempt >= len(delays):
                    logger.warning("%s of %s to %s failed: %s", kind, meta.microbatch.key, peer, e)
                    self.on_failure(peer)
                    return None
                await asyncio.sleep(delays[attempt])
                attempt += 1
                continue
            self.links.observe_transfer(peer, queued, seconds)
            self.traffic.add("aggregation" if is_aggregation(meta) else kind, size)
            if not ack.accepted:
                logger.info("%s of %s refused by %s: %s", kind, meta.microbatch.key, peer, ack.reason)
            return ack

    async def _attempt(self, call: Callable[..., Awaitable[Ack]], peer: str, meta: TransferMeta, tensor: torch.Tensor,
                       size: int) -> tuple[Ack, int, float]:
        """One try, counted in the uplink's bytes in flight while it lasts: (the ack, the bytes it queued
        behind, its seconds). Ours goes out behind what is under way, so its deadline covers those too."""
        started, queued = time.monotonic(), self.in_flight_bytes + size
        timeout_s = self.timeout_for(peer, queued)
        self.in_flight_bytes += size
        try:
            ack = await call(peer, meta, tensor, timeout_s=timeout_s)
            return ack, queued, time.monotonic() - started
        except PeerTimeout:
            self.links.observe_timeout(peer, queued, timeout_s)
            raise
        finally:
            self.in_flight_bytes -= size

    async def forward_with_failover(self, hop: Hop | None, meta: TransferMeta, tensor: torch.Tensor,
                                    other: Callable[[set[str]], Hop | None]) -> Hop | None:
        """Send a forward to ``hop``; if that peer is unreachable or refuses it (e.g. it is leaving),
        resend the same output to ``other(tried)`` (another replica of the next stage), and so on.
        Returns the hop that took it, or None."""
        tried: set[str] = set()
        attempt = meta.attempt
        while hop is not None:
            update = {"flow_unit": hop.unit, "attempt": attempt}
            ack = await self.send("forward", hop.peer, meta.model_copy(update=update), tensor)
            if ack is not None and (ack.accepted or ack.duplicate):
                return hop
            tried.add(hop.peer)
            hop, attempt = other(tried), min(attempt + 1, 1000)
            if hop is not None:
                logger.info("resending %s to %s", meta.microbatch.key, hop.peer)
        logger.warning("no replica of the next stage took %s", meta.microbatch.key)
        return None
