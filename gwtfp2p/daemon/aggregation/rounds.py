"""One aggregation round's data: the contributions received, our own, to whom ours went, the outcome.

Plain data shared by the aggregator and its callers (``Outcome`` is what an iteration's step reports);
the agreement on which contributions count lives in ``agreement``, the driving in ``aggregator``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gwtfp2p.daemon.aggregation.agreement import RoundAgreement
from gwtfp2p.daemon.aggregation.encoding import WireContribution
from gwtfp2p.model.trainable import StepResult


@dataclass
class Received:
    contribution: WireContribution  # as it travels: forwarded as is, decoded when reduced
    tags: dict[str, Any]


@dataclass
class Round:
    """Contributions of one iteration, the agreement on them, and to whom ours went."""

    iteration: int
    agreement: RoundAgreement
    received: dict[str, Received] = field(default_factory=dict)
    own: Received | None = None
    pushed: dict[str, frozenset[str]] = field(default_factory=dict)  # peer -> expected list our push carried
    delivered: int = 0
    heard: bool = False
    held: bool = False  # online same-part peers have not announced their membership: no decision yet
    begun: float = 0.0  # clock time our own part of the round began (``gather``)

    def get(self, peer: str) -> Received | None:
        return self.own if peer == self.agreement.me else self.received.get(peer)


@dataclass(frozen=True)
class Outcome:
    step: StepResult
    members: tuple[str, ...]  # the agreed contributions, by member
    tags: dict[str, dict[str, Any]]  # every used member's tags (losses, tokens), ours included
    how: str = "fast"  # fast | leader | adopted
    dropped: tuple[str, ...] = ()  # expected members whose contribution was not used
    seconds: float = 0.0


@dataclass(frozen=True)
class Gathered:
    """An iteration's agreed contributions, reduced: what the step needs, and what it reports."""

    iteration: int
    members: tuple[str, ...]  # the agreed contributions, by member
    tags: dict[str, dict[str, Any]]  # every used member's tags
    mean: torch.Tensor  # the part's mean gradient (flat, CPU)
    count: int
    sq_norm: float  # the part's squared gradient norm (for the whole model's, in global clipping)
    how: str
    dropped: tuple[str, ...]
    started_at: float  # clock time the aggregation began
    received: tuple[Received, ...] = ()  # the agreed contributions as they travelled (before the screen)
    lost: tuple[str, ...] = ()  # expected members the agreement left out (their work can be redone: ``redo``)
