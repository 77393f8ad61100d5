"""Outgoing tensor transfers with adaptive deadlines, bounded retries and measured timings.

The deadline of a transfer is a multiple of what the link should need (RTT + size / bandwidth,
from ``LinkTable``, + the emulated delay) with a floor, never one fixed number (DESIGN §3,
``timeouts.transfer_timeout_s``). Each successful transfer feeds the bandwidth estimate. Retries
cover transient failures (a busy peer, a dropped stream); a peer that stays unreachable is
reported (``on_failure``: the node probes it and, if dead, recovers, ``recovery.py``), and a
forward fails over to another replica of the next stage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import torch

from gwtfp2p.daemon.links import LinkTable
from gwtfp2p.daemon.routing import Hop
from gwtfp2p.daemon.timeouts import TIMEOUT_FACTOR, TRANSFER_FLOOR_S, transfer_timeout_s
from gwtfp2p.transport import Ack, PeerUnreachable, TransferMeta, Transport, TransportError

logger = logging.getLogger(__name__)
RETRY_DELAYS_S = (0.2, 1.0)
UNREACHABLE_RETRY_DELAYS_S = (0.2,)  # a dial error: one more try, then it is the recovery's turn


class Sender:
    """Forward/backward/aggregation transfers of one node."""

    def __init__(self, transport: Transport, links: LinkTable, floor_s: float = TRANSFER_FLOOR_S) -> None:
        self.transport = transport
        self.links = links
        self.floor_s = floor_s
        self.bytes_sent = 0
        self.on_failure: Callable[[str], None] = lambda _peer: None  # a peer that stayed unreachable

    def timeout_for(self, peer: str, size_bytes: int) -> float:
        emulated = self.transport.link.delay_s(peer, size_bytes) * 2 if self.transport.link else 0.0
        return transfer_timeout_s(self.links.rtt(peer), size_bytes, self.links.bandwidth(peer), emulated,
                                  TIMEOUT_FACTOR, self.floor_s)

    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
        """Send ``tensor`` (kind ``forward`` or ``backward``); the peer's ack, or None after retries."""
        size = tensor.numel() * tensor.element_size()
        call = self.transport.forward if kind == "forward" else self.transport.backward
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                ack = await call(peer, meta, tensor, timeout_s=self.timeout_for(peer, size))
            except TransportError as e:
                delays = UNREACHABLE_RETRY_DELAYS_S if isinstance(e, PeerUnreachable) else RETRY_DELAYS_S
                logger.debug("%s of %s to %s failed (attempt %d): %s", kind, meta.microbatch.key, peer, attempt, e)
                if attempt >= len(delays):
                    logger.warning("%s of %s to %s failed: %s", kind, meta.microbatch.key, peer, e)
                    self.on_failure(peer)
                    return None
                await asyncio.sleep(delays[attempt])
                attempt += 1
                continue
            self.links.observe_transfer(peer, size, time.monotonic() - started)
            self.bytes_sent += size
            if not ack.accepted:
                logger.info("%s of %s refused by %s: %s", kind, meta.microbatch.key, peer, ack.reason)
            return ack

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
