"""What a part's replicas accept from each other: valid contributions, and which ones a step uses.

Pure (no I/O): ``check_contribution`` validates one contribution from the network before it is
acknowledged (an exact int64 sum within its bound, a zero sum for zero microbatches, counts and the
data holders' exact loss sums in range, ``losstags``); ``screen`` decides, identically on every
replica, which of an iteration's agreed contributions the step uses. Its rules, against the
contributions' medians:

* a contribution's gradient norm per microbatch (``scaled_norm``: norm / count**0.75, which honest
  replicas with different counts keep within (count ratio)**0.25 of each other) may be at most the
  run's ``screen_factor`` times the (lower) median's (0: no screen at all, see ``RunSpec``);
* with three or more contributions, a mean gradient that does not point away from the coordinate-wise
  median of the replicas' mean gradients (a trimmed, median-based direction: negative cosine is out);
* a sum of zero microbatches is zero.

Counts are not bounded against each other (the flow splits microbatches over replicas unevenly): an
inflated count dilutes the step, and the norm bound grows only as count**0.75, so inflating it gains
a poisoned direction nothing.

Honest replicas whose gradients are of similar size and direction pass (the step stays the exact sum);
an honest spike, or a contribution of few microbatches pointing against the others, can be excluded as
well (docs/security.md: the screen is a run-spec choice). A poisoned contribution is excluded with the
reason, which the aggregator logs. Every number here is computed to the same bits on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gwtfp2p.daemon.aggregation import losstags
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.fixedpoint import BOUND_LIMIT
from gwtfp2p.model.gradnorm import tensor_sq_norms

MAX_COUNT = 1_000_000
MAX_LOSS_PER_MICROBATCH = 1e4  # a cross-entropy far beyond any real one (ln of the vocabulary is ~ 10)
LOSS_TAGS = (losstags.SUM_TAG, losstags.COUNT_TAG, "tokens")  # what a data holder's contribution carries
SIGNATURE_TAGS = ("sig0", "sig1", "sig2")  # the origin's signature, cut to fit tag values
KNOWN_TAGS = frozenset((*LOSS_TAGS, *SIGNATURE_TAGS))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_tags(tags: Mapping[str, Any], count: int, tokens_per_microbatch: int) -> str:
    """Why the tags of a contribution are not acceptable ("" if they are)."""
    unknown = sorted(set(tags) - KNOWN_TAGS)
    if unknown:
        return f"unknown contribution tags {unknown}"
    n_loss, tokens = tags.get("n_loss", 0), tags.get("tokens", 0)
    if not _is_int(n_loss) or not 0 <= n_loss <= count:
        return f"n_loss {n_loss!r} must be an integer within 0..count ({count})"
    if not _is_int(tokens) or not 0 <= tokens <= n_loss * tokens_per_microbatch:
        return f"tokens {tokens!r} must be within 0..n_loss x {tokens_per_microbatch}"
    try:
        losses = losstags.decode(tags)
    except ValueError as e:
        return str(e)
    total = losses.total  # a non-finite one is a diverged training's (its gradient is screened out), allowed
    if (n_loss == 0 and total != 0.0) or (math.isfinite(total) and abs(total) > MAX_LOSS_PER_MICROBATCH * n_loss):
        return f"loss_sum {tags.get('loss_sum')!r} is not a loss of {n_loss} microbatches"
    return ""


def check_contribution(contribution: GradContribution, numel: int) -> str:
    """Why a contribution from the network cannot be used ("" if it can): the checks the reduction
    would otherwise fail on inside the step, and a non-zero sum of zero microbatches."""
    g, count, bound = contribution.grad_sum, contribution.count, contribution.bound
    if g.dtype != torch.int64 or g.dim() != 1 or g.numel() != numel:
        return f"a contribution is a flat int64 fixed-point sum of {numel} values"
    if not _is_int(count) or not 0 <= count <= MAX_COUNT or not _is_int(bound) or not 0 <= bound <= BOUND_LIMIT:
        return f"count {count!r} or bound {bound!r} out of range"
    if numel and bound < BOUND_LIMIT:
        low, high = torch.aminmax(g)
        if max(-int(low), int(high)) > bound:
            return "gradient values exceed the bound sent with them"
    if count == 0 and (bound != 0 or (numel and bool(g.any()))):
        return "a non-zero gradient sum of zero microbatches"
    return ""


@dataclass(frozen=True)
class Screened:
    """The contributions a step uses (in the given order) and the excluded ones with the reason."""

    kept: tuple[str, ...]
    excluded: dict[str, str]


def _lower_median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def scaled_norm(contribution: GradContribution) -> float:
    """Gradient norm per microbatch**0.75 (``inf`` for an unrepresentable sum; 0 for no microbatch)."""
    if contribution.count == 0:
        return 0.0
    if contribution.bound >= BOUND_LIMIT:
        return math.inf
    sq = tensor_sq_norms([contribution.grad_sum.to(torch.float64)])[0]
    return math.sqrt(sq) / contribution.count ** 0.75


def _median_direction(means: list[torch.Tensor]) -> torch.Tensor:
    """The coordinate-wise (lower) median of the per-microbatch mean gradients."""
    return torch.stack(means).sort(dim=0).values[(len(means) - 1) // 2]


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) from squared norms only (deterministic): a.b = (|a+b|^2 - |a-b|^2) / 4."""
    plus, minus, na, nb = tensor_sq_norms([a + b, a - b, a, b])
    return 0.0 if na == 0 or nb == 0 else (plus - minus) / 4 / math.sqrt(na * nb)


def screen(contributions: Sequence[GradContribution], factor: float) -> Screened:
    """Which contributions an iteration's step uses (see the module docstring); ``factor``: the run's
    ``screen_factor`` (0: only a non-zero sum of zero microbatches is left out)."""
    active = [c for c in contributions if c.count > 0] if factor else []
    excluded = {c.replica_id: "a non-zero gradient sum of zero microbatches" for c in contributions
                if c.count == 0 and (c.bound != 0 or bool(c.grad_sum.any()))}
    if len(active) >= 2:
        norms = {c.replica_id: scaled_norm(c) for c in active}
        reference = _lower_median(list(norms.values()))
        for c in active:
            if norms[c.replica_id] > factor * reference:
                excluded[c.replica_id] = (f"gradient norm per microbatch**0.75 {norms[c.replica_id]:.4g} is over "
                                          f"{factor:g} x the replicas' median {reference:.4g}")
    if len(active) >= 3:
        rest = [c for c in active if c.replica_id not in excluded and c.bound < BOUND_LIMIT]
        if len(rest) >= 3:
            means = [c.grad_sum.to(torch.float64) / c.count for c in rest]
            center = _median_direction(means)
            for c, mean in zip(rest, means, strict=True):
                cosine = _cosine(mean, center)
                if cosine < 0:
                    excluded[c.replica_id] = (f"its mean gradient points away from the replicas' median "
                                              f"(cos {cosine:.3f})")
    kept = tuple(c.replica_id for c in contributions if c.replica_id not in excluded)
    return Screened(kept, excluded)
