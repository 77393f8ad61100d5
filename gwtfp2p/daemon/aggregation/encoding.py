"""A replica's gradient contribution as it travels to the part's other replicas, and back (``aggregate_codec``).

``none``: the exact int64 fixed-point sum itself (the swarm steps exactly as one process). A lossy codec
(``transport.compression``): the sum as float32 (rounded once), encoded; ``decode`` turns the bytes back
into fixed point. Every replica decodes every contribution it reduces from the bytes that travel, its
own included, so all reduce the same integers (bit-identical replicas, any arrival order); a forwarded
contribution is forwarded as those bytes. The decoded sum is not the single-process sum: each
replica's sum is rounded once, so the step depends on how the microbatches were split over replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gwtfp2p.config import encoded_bytes
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.fixedpoint import BOUND_LIMIT, CHUNK, to_fixed, to_float
from gwtfp2p.transport.compression import decode, encode, is_lossy


@dataclass(frozen=True)
class WireContribution:
    """One replica's contribution as it travels.

    ``payload`` is the flat int64 sum (``none``) or its encoded bytes (flat uint8). ``bound`` is the
    sum's bound (``GradContribution``); under a lossy codec it only tells whether the sum is representable
    (``BOUND_LIMIT``: not), the decoded sum's own bound being its largest magnitude.
    """

    origin: str
    payload: torch.Tensor
    count: int
    bound: int


class ContributionCodec:
    """Encodes and decodes one part's contributions (``numel`` values) under the run's aggregate codec."""

    def __init__(self, codec: str, numel: int) -> None:
        self.codec = codec
        self.lossy = is_lossy(codec)
        self.numel = numel

    def refusal(self, codec: str, payload: torch.Tensor) -> str:
        """Why a received contribution cannot be used ("" if it can): another codec, or the wrong size."""
        if codec != self.codec:
            return f"wire codec mismatch: this run sends contributions as {self.codec}, this one came as {codec}"
        size = encoded_bytes(codec, self.numel, 4) if self.lossy else self.numel
        dtype = torch.uint8 if self.lossy else torch.int64
        if payload.numel() != size or payload.dtype != dtype or payload.dim() != 1:
            return f"a {codec} contribution is {size} {dtype} values, got {payload.numel()} {payload.dtype}"
        return ""

    def encode(self, c: GradContribution) -> WireContribution:
        """On the compute thread: what ``c`` travels as."""
        if not self.lossy:
            return WireContribution(c.replica_id, c.grad_sum, c.count, c.bound)
        if c.bound >= BOUND_LIMIT or c.count == 0:
            values = torch.zeros(self.numel, dtype=torch.float32)
        else:
            values = to_float(c.grad_sum, 1, torch.float32)  # the exact sum, rounded once
        return WireContribution(c.replica_id, encode(values, self.codec), c.count, min(c.bound, BOUND_LIMIT))

    def decode(self, w: WireContribution) -> GradContribution:
        """On the compute thread: the contribution every replica reduces for ``w``."""
        if not self.lossy:
            return GradContribution(w.origin, w.payload.reshape(-1), w.count, w.bound)
        values = decode(w.payload, self.codec, torch.float32, (self.numel,))
        if w.bound >= BOUND_LIMIT:
            return GradContribution(w.origin, torch.zeros(self.numel, dtype=torch.int64), w.count, BOUND_LIMIT)
        fixed = torch.empty(self.numel, dtype=torch.int64)
        peak = 0
        for start in range(0, self.numel, CHUNK):  # chunks bound the temporaries
            fixed[start:start + CHUNK], chunk_peak = to_fixed(values[start:start + CHUNK])
            peak = max(peak, chunk_peak)
        return GradContribution(w.origin, fixed, w.count, min(peak, BOUND_LIMIT))
