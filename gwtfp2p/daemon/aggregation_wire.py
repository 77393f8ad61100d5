"""Aggregation messages on the transport's tensor path: contributions and the agreement's messages.

Every message is a forward RPC tagged ``kind=grad`` (``handlers.py`` routes those to the
``Aggregator``) with ``op``: ``contrib`` (a gradient sum: ``count``, ``origin`` when forwarded for
another member, the part's own tags such as a data holder's loss sum; ``path`` = the sender's
expected members), ``view`` (the sender's expected members changed), and the agreement's
``query`` / ``report`` / ``decided`` / ``want`` (``path`` = peer ids, ``epoch``; empty tensor).
Owns the encoding and its validation (peers are untrusted), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gwtfp2p.daemon.agreement import DECIDED, QUERY, REPORT, WANT
from gwtfp2p.transport import MicrobatchId, TransferMeta

GRAD_KIND = "grad"
CONTRIB, VIEW = "contrib", "view"
OPS = (CONTRIB, VIEW, QUERY, REPORT, DECIDED, WANT)
PROTOCOL_TAGS = ("kind", "op", "count", "origin", "epoch")
MAX_IDS = 64
EMPTY = torch.zeros(0)


class WireError(ValueError):
    """An aggregation message that does not parse (the reason goes back in the ack)."""


@dataclass(frozen=True)
class AggMessage:
    op: str
    iteration: int
    ids: tuple[str, ...]
    origin: str = ""  # contrib: whose contribution (the sender unless forwarded)
    count: int = 0
    epoch: int = 0
    tags: dict[str, Any] | None = None  # contrib: the part's own tags (loss sums, tokens)


def encode(self_id: str, stage: int, message: AggMessage) -> TransferMeta:
    tags: dict[str, Any] = {"kind": GRAD_KIND, "op": message.op}
    if message.op == CONTRIB:
        tags.update(message.tags or {})
        tags["count"] = message.count
        if message.origin and message.origin != self_id:
            tags["origin"] = message.origin
    if message.op in (QUERY, REPORT):
        tags["epoch"] = message.epoch
    return TransferMeta(microbatch=MicrobatchId(data_holder=self_id, iteration=message.iteration, index=0),
                        stage=stage, path=tuple(message.ids)[:MAX_IDS], tags=tags)


def decode(sender: str, meta: TransferMeta, tensor: torch.Tensor, numel: int) -> AggMessage:
    """The message in ``meta``; ``WireError`` if malformed or a contribution of the wrong size."""
    tags = meta.tags
    op = tags.get("op", CONTRIB)
    if op not in OPS:
        raise WireError(f"unknown aggregation op {op!r}")
    t = meta.microbatch.iteration
    if op != CONTRIB:
        epoch = tags.get("epoch", 0)
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < -1:
            raise WireError("bad epoch")
        return AggMessage(op, t, meta.path, epoch=epoch)
    count, origin = tags.get("count"), tags.get("origin", sender)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise WireError("a contribution needs an integer count >= 0")
    if not isinstance(origin, str) or not origin:
        raise WireError("bad origin")
    if tensor.numel() != numel or not tensor.dtype.is_floating_point:
        raise WireError(f"a contribution has {numel} floating-point values, got {tensor.numel()} {tensor.dtype}")
    own = {k: v for k, v in tags.items() if k not in PROTOCOL_TAGS}
    return AggMessage(CONTRIB, t, meta.path, origin=origin, count=count, tags=own)
