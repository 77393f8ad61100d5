"""The data holders' loss sums as they travel in their aggregation contributions: exact, in any order.

A data holder's contribution carries its iteration's ``LossSum`` (``model.losssum``) in two tags:
``n_loss`` (how many losses) and ``loss_sum``, the exact sum written as a few floats (``encode_sum``).
``swarm_loss`` merges every data holder's into the swarm's: its ``mean`` is the correctly rounded exact
sum of all microbatch losses over their number, the same bits whatever the order the contributions come
in and however the microbatches were split over data holders. ``decode`` validates (network data).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from gwtfp2p.model.losssum import MAX_PARTIALS, LossSum

SUM_TAG, COUNT_TAG = "loss_sum", "n_loss"
MAX_TEXT_CHARS = 128  # a transfer tag's longest string value (transport.messages.TagValue)


def _expansion(partials: tuple[float, ...]) -> list[float]:
    """The exact sum of ``partials`` as the fewest floats: the rounded sum, then the rounded rest, ...
    (each term takes 53 more bits, so losses that are float32 values need at most four)."""
    terms: list[float] = []
    rest = list(partials)
    while len(terms) < MAX_PARTIALS:
        term = math.fsum(rest)  # correctly rounded: rest - term is exact and below half an ulp of term
        if term == 0.0:
            return terms
        terms.append(term)
        rest.append(-term)
    raise ValueError("a loss sum spanning more than the float range")


def encode_sum(loss: LossSum) -> str:
    """The text of the ``loss_sum`` tag: the exact sum's terms (``repr``, exact) separated by spaces,
    then the non-finite part if any (``inf``, ``-inf``, ``nan``); "" for an empty sum."""
    try:
        terms = _expansion(loss.partials)
    except OverflowError:  # partials whose sum exceeds the float range: the total is infinite
        terms, loss = [], LossSum((), loss.count, loss.nonfinite + math.copysign(math.inf, loss.partials[-1]))
    words = [repr(x) for x in terms] + ([repr(loss.nonfinite)] if loss.nonfinite != 0.0 else [])
    text = " ".join(words)
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"loss sum {text!r} does not fit a tag of {MAX_TEXT_CHARS} characters")
    return text


def encode(loss: LossSum) -> dict[str, Any]:
    """The tags a data holder's contribution carries for ``loss``."""
    return {SUM_TAG: encode_sum(loss), COUNT_TAG: loss.count}


def decode(tags: Mapping[str, Any]) -> LossSum:
    """The ``LossSum`` in a contribution's tags (absent: no loss, as in a relay's); ``ValueError`` naming the
    tag if they are malformed."""
    text, count = tags.get(SUM_TAG, ""), tags.get(COUNT_TAG, 0)
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"{SUM_TAG} must be the text of an exact loss sum (at most {MAX_TEXT_CHARS} characters), "
                         f"got {text!r}")
    try:
        values = [float(word) for word in text.split()]
    except ValueError:
        raise ValueError(f"{SUM_TAG} {text!r} is not a list of numbers") from None
    partials = [x for x in values if math.isfinite(x)]
    nonfinite = sum(x for x in values if not math.isfinite(x))  # inf/nan arithmetic is order-free
    return LossSum.from_parts(partials, count, nonfinite)


def swarm_loss(tags: Iterable[Mapping[str, Any]]) -> LossSum:
    """The exact sum of every member's losses (the tags of an iteration's used contributions: admitted,
    so they decode)."""
    return LossSum.merge(decode(t) for t in tags)
