"""What a swarm with wire codecs computes, in one process: ``PipelineHarness`` with the codecs at every hop.

``with_codecs(harness, codecs)`` wraps each executor of an in-process ``PipelineHarness`` so that what it
receives passes through a codec exactly where a swarm's transport decodes it: a stage's input and the
data holder's tail input (forward codec), a stage's and the head's incoming gradient (backward codec),
and every replica's contribution (aggregate codec: encoded by its replica, decoded from those bytes by
every replica, ``daemon/aggregation/encoding.py``). Used by the codec parity test and ``bench_codec.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from gwtfp2p.daemon.aggregation.encoding import ContributionCodec
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.harness import PipelineHarness
from gwtfp2p.transport.compression import WireCodecs, roundtrip


class CodecHops:
    """One executor (a stage replica or a data holder) behind the run's wire codecs."""

    def __init__(self, inner: Any, codecs: WireCodecs) -> None:
        self._inner = inner
        self._codecs = codecs
        self._contributions = ContributionCodec(codecs.aggregate, inner.numel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def forward(self, mb_id: str, hidden: torch.Tensor) -> torch.Tensor:
        return self._inner.forward(mb_id, roundtrip(hidden, self._codecs.forward))

    def backward(self, mb_id: str, grad_output: torch.Tensor) -> torch.Tensor:
        return self._inner.backward(mb_id, roundtrip(grad_output, self._codecs.backward))

    def tail_backward(self, mb_id: str, hidden: torch.Tensor) -> tuple[float, torch.Tensor]:
        return self._inner.tail_backward(mb_id, roundtrip(hidden, self._codecs.forward))

    def head_backward(self, mb_id: str, grad_hidden: torch.Tensor) -> None:
        self._inner.head_backward(mb_id, roundtrip(grad_hidden, self._codecs.backward))

    def grad_contribution(self, replica_id: str) -> GradContribution:
        codec = self._contributions
        return codec.decode(codec.encode(self._inner.grad_contribution(replica_id)))


def with_codecs(harness: PipelineHarness, codecs: WireCodecs) -> PipelineHarness:
    """``harness`` with every executor behind ``codecs`` (in place; returned for convenience)."""
    harness.data_holders = [CodecHops(dh, codecs) for dh in harness.data_holders]  # type: ignore[misc]
    harness.stages = [[CodecHops(rep, codecs) for rep in group] for group in harness.stages]  # type: ignore[misc]
    return harness
