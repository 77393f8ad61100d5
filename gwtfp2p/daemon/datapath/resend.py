"""How a lost hop's work is redone, decided without I/O: which holder to rejoin, the resend's tags, whom to tell.

When a node's next hop is lost, it asks the nodes downstream of it which of the affected microbatches
they still hold (``Where``/``Held``); ``Claims`` keeps the nearest holder of each. ``resend_meta``
tags the kept output ``lost``/``from`` and, with a holder, ``rejoin`` and ``then.<stage>``: the new
replica recomputes one hop and hands it to that holder, which answers with its gradient instead of
recomputing. ``on_lost`` picks the reaction to a downstream report (``Lost``), ``report_chain`` the
upstream hops to tell when our gradient cannot reach our previous hop. Pure functions and data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gwtfp2p.daemon.datapath.kept import Kept
from gwtfp2p.transport import TransferMeta

RECOVERY_TAGS = ("lost", "from", "rejoin")
Claim = tuple[int, str]  # (hops downstream of the lost stage, holder)


def is_recovery_tag(key: str) -> bool:
    return key in RECOVERY_TAGS or key.startswith("then.")


def distance(holder_stage: int, lost_stage: int, n_stages: int) -> int:
    """Hops from the lost stage down to a holder of ``holder_stage`` (0: the data holder's tail, last)."""
    return (n_stages + 1 if holder_stage == 0 else holder_stage) - lost_stage


@dataclass
class Claims:
    """Answers to ``Where`` about one lost peer: who we still wait for, and the nearest holder of each key."""

    waiting: set[str]
    claims: dict[str, Claim] = field(default_factory=dict)

    def claim(self, key: str, hops: int, holder: str) -> None:
        if key not in self.claims or hops < self.claims[key][0]:
            self.claims[key] = (hops, holder)

    def answered(self, peer: str) -> bool:
        """``peer`` answered (or cannot); True once nobody is left to wait for."""
        self.waiting.discard(peer)
        return not self.waiting


@dataclass(frozen=True)
class Resend:
    meta: TransferMeta  # the kept output's metadata with the recovery tags
    holder: str  # the downstream node to rejoin ("" if none: a plain forward resend)
    kind: str  # forward_resend | backward_resend


def resend_meta(kept_meta: TransferMeta, lost: str, self_id: str, claim: Claim | None, lost_stage: int,
                n_stages: int) -> Resend:
    """The resend of a kept output whose hop ``lost`` is gone, rejoining the claimed holder if any."""
    tags = {k: v for k, v in kept_meta.tags.items() if not is_recovery_tag(k)}
    tags.update({"lost": lost, "from": self_id})
    holder = ""
    if claim is not None:
        hops, holder = claim
        tags["rejoin"] = True
        holder_stage = lost_stage + hops
        if holder_stage <= n_stages:
            tags[f"then.{holder_stage}"] = holder
    meta = kept_meta.model_copy(update={"tags": tags, "attempt": min(kept_meta.attempt + 1, 1000)})
    return Resend(meta, holder, "backward_resend" if holder else "forward_resend")


def redirect_meta(kept_meta: TransferMeta, incoming_tags: dict) -> TransferMeta:
    """Our kept output with the recovery tags of a resend that reached us (to rejoin a holder downstream)."""
    recovery = {k: v for k, v in incoming_tags.items() if is_recovery_tag(k)}
    return kept_meta.model_copy(update={"tags": {**kept_meta.tags, **recovery}})


class LostAction(enum.Enum):
    IGNORE = "ignore"  # not ours any more, or a resend is under way
    CLAIM = "claim"  # a query about the lost peer is running: the reporter is a holder
    RECOVER = "recover"  # the lost peer took it from us: recover it (and its other outputs)
    RESEND_AGAIN = "resend_again"  # resent before the holder was known: resend once more, to rejoin it


def on_lost(kept: Kept | None, lost: str, reporter: str, querying: bool) -> LostAction:
    """What to do when ``reporter`` says its gradient of a kept output cannot reach ``lost``."""
    if kept is None:
        return LostAction.IGNORE
    if querying:
        return LostAction.CLAIM
    if kept.hop is not None and kept.hop.peer == lost and not kept.busy:
        return LostAction.RECOVER
    if kept.lost == lost and kept.hint != reporter and not kept.busy:
        return LostAction.RESEND_AGAIN
    return LostAction.IGNORE


def report_chain(path: tuple[str, ...], lost: str) -> list[tuple[str, str]]:
    """Our gradient cannot reach ``lost`` (our previous hop): the hops upstream of it to tell, nearest
    first, each with the hop after it (the one it sent to): ``[(upstream, its next hop), ...]``."""
    if lost not in path:
        return []
    index = len(path) - 1 - path[::-1].index(lost)
    return [(path[j], path[j + 1]) for j in range(index - 1, -1, -1)]
