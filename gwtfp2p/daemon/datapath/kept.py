"""Outputs a node sent on and keeps until their gradient is back: deadlines, resends, completions.

Pure bookkeeping, no I/O (times are passed in). One entry per microbatch id: the metadata and
tensor as sent, the hop that took it, when, and the backward deadline (``timeouts``). The outbox
and the recovery driver ask which entries are due for a probe, which went through a peer that
died, and mark resends; a completion reports the measured round trip (for the EMA, only when
nothing was resent) or, for a resent microbatch, the extra time the loss cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.transport import TransferMeta


@dataclass
class Kept:
    meta: TransferMeta  # as sent (stage = the next stage), recovery tags included after a resend
    output: Any  # the tensor sent (a torch.Tensor; kept opaque here)
    hop: Hop | None  # who took it (None: nobody yet, retried at the deadline)
    sent_at: float
    wait_s: float  # current backward deadline (seconds)
    deadline_at: float  # when to probe the next hop
    expected_s: float  # expected round trip when first sent
    failed_at: float | None = None  # first detection of a lost next hop
    lost: str = ""  # the peer whose loss made us resend
    hint: str = ""  # the downstream holder the resend was routed to rejoin ("" if none)
    kind: str = ""  # forward_resend (nobody downstream held it) or backward_resend (rejoined a holder)
    resends: int = 0
    busy: bool = False  # a resend or probe is under way


@dataclass(frozen=True)
class Completion:
    key: str
    round_trip_s: float
    resent: bool
    kind: str
    lost: str
    extra_s: float  # beyond the expected round trip (0 when on time)
    detect_s: float | None  # from the send to the detection of the loss


class KeptTable:
    def __init__(self) -> None:
        self.entries: dict[str, Kept] = {}

    def add(self, key: str, meta: TransferMeta, output: Any, hop: Hop | None, now: float, wait_s: float,
            expected_s: float) -> Kept:
        kept = Kept(meta, output, hop, now, wait_s, now + wait_s, expected_s)
        self.entries[key] = kept
        return kept

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> Kept | None:
        return self.entries.get(key)

    def due(self, now: float) -> list[tuple[str, Kept]]:
        """Entries whose deadline passed and that are not being handled."""
        return [(k, e) for k, e in self.entries.items() if not e.busy and now >= e.deadline_at]

    def via(self, peer: str) -> list[str]:
        """Entries (not being handled) that the given peer took."""
        return [k for k, e in self.entries.items() if not e.busy and e.hop is not None and e.hop.peer == peer]

    def extend(self, key: str, now: float, longer: Callable[[float], float]) -> None:
        """The next hop answered a probe: wait ``longer(current wait)`` from now."""
        kept = self.entries.get(key)
        if kept is not None:
            kept.wait_s = longer(kept.wait_s)
            kept.deadline_at = now + kept.wait_s

    def failed(self, key: str, now: float) -> None:
        kept = self.entries.get(key)
        if kept is not None and kept.failed_at is None:
            kept.failed_at = now

    def resent(self, key: str, meta: TransferMeta, hop: Hop | None, lost: str, kind: str, now: float,
               wait_s: float) -> None:
        """A resend of ``key`` to ``hop`` (None: nobody took it yet): new deadline from now."""
        kept = self.entries.get(key)
        if kept is None:
            return
        kept.meta, kept.hop, kept.lost, kept.kind = meta, hop, lost, kind
        kept.resends += 1
        kept.wait_s, kept.deadline_at = wait_s, now + wait_s

    def complete(self, key: str, now: float) -> Completion | None:
        """The gradient of ``key`` is back: forget the entry and say what it cost."""
        kept = self.entries.pop(key, None)
        if kept is None:
            return None
        round_trip = now - kept.sent_at
        extra = max(0.0, round_trip - kept.expected_s) if kept.resends else 0.0
        detect = None if kept.failed_at is None else kept.failed_at - kept.sent_at
        return Completion(key, round_trip, kept.resends > 0, kept.kind, kept.lost, extra, detect)

    def drop(self, keep: Callable[[str, Kept], bool]) -> list[str]:
        """Forget every entry ``keep`` rejects; returns their keys."""
        gone = [k for k, e in self.entries.items() if not keep(k, e)]
        for key in gone:
            del self.entries[key]
        return gone
