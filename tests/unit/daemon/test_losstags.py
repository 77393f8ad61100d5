"""The data holders' loss sums on the wire (``aggregation/losstags.py``) and the swarm loss a data holder
reports (``HolderRole.clip_norm``): exact, the same bits whatever the arrival order and the split of the
microbatches over data holders; malformed tags are refused with the tag named."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import struct

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.aggregation import losstags
from gwtfp2p.daemon.aggregation.rounds import Gathered
from gwtfp2p.daemon.aggregation.vetting import check_tags
from gwtfp2p.daemon.datapath.holder import HolderRole
from gwtfp2p.daemon.datapath.ledger import IterationLedger
from gwtfp2p.daemon.wire import Closed
from gwtfp2p.model.losssum import LossSum

# what a tail returns: float(a float32 cross-entropy), anywhere from 0 to the vetting's bound
LOSSES = st.floats(min_value=0.0, max_value=1e4, width=32)


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _split(losses: list[float], cuts: list[int], order: random.Random) -> list[dict]:
    """The losses over data holders (cut at ``cuts``), each holder's tags, in a shuffled arrival order."""
    bounds = sorted({0, len(losses), *(c % (len(losses) + 1) for c in cuts)})
    tags = [losstags.encode(LossSum.of(losses[a:b])) for a, b in itertools.pairwise(bounds)]
    order.shuffle(tags)
    return tags


@settings(max_examples=300, deadline=None)
@given(st.lists(LOSSES, min_size=1, max_size=40), st.lists(st.integers(0, 40), max_size=5), st.integers(0, 2**32))
def test_the_swarm_loss_is_the_correctly_rounded_mean_whatever_the_split_and_order(losses, cuts, seed) -> None:
    exact = math.fsum(losses) / len(losses)
    first = losstags.swarm_loss(_split(losses, cuts, random.Random(seed)))
    again = losstags.swarm_loss(_split(list(reversed(losses)), cuts[::-1], random.Random(seed + 1)))
    assert first.count == again.count == len(losses)
    assert first.mean == again.mean == exact  # bitwise: == on floats, and no NaN here


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e4, width=32, allow_subnormal=True), max_size=200))
def test_a_holders_sum_of_float32_losses_fits_one_tag_and_decodes_to_the_same_sum(losses) -> None:
    loss = LossSum.of(losses)
    tags = losstags.encode(loss)
    assert len(tags["loss_sum"]) <= losstags.MAX_TEXT_CHARS and len(tags["loss_sum"].split()) <= 4
    back = losstags.decode(tags)
    assert back.count == len(losses) and back.total == loss.total == math.fsum(losses)
    assert check_tags(tags, len(losses), 32) == ""


def test_the_exact_sum_keeps_what_a_float_sum_in_arrival_order_loses() -> None:
    """Data holders whose float sums, added in two arrival orders, differ (the old swarm loss): the exact
    sum does not. (float32 losses of similar size add exactly even in float64: it takes losses some 30
    binary orders of magnitude apart, e.g. a memorized microbatch's next to fresh ones.)"""
    rng = random.Random(1)
    for _ in range(1000):
        holders = [[_f32(rng.uniform(2.0, 6.0)), _f32(10 ** rng.uniform(-12, -6))] for _ in range(3)]
        sums = [math.fsum(h) for h in holders]
        if (sums[0] + sums[1]) + sums[2] != (sums[2] + sums[1]) + sums[0]:
            break
    else:
        raise AssertionError("no realistic case where the order of a float sum matters")
    tags = [losstags.encode(LossSum.of(h)) for h in holders]
    exact = math.fsum(x for h in holders for x in h)
    assert losstags.swarm_loss(tags).total == losstags.swarm_loss(tags[::-1]).total == exact


def test_non_finite_losses_travel_and_make_the_swarm_loss_non_finite() -> None:
    tags = losstags.encode(LossSum.of([2.5, math.nan]))
    assert tags == {"loss_sum": "2.5 nan", "n_loss": 2}
    assert check_tags(tags, 2, 32) == ""  # a diverged training's loss is not a forgery
    assert math.isnan(losstags.swarm_loss([tags, losstags.encode(LossSum.of([1.0]))]).mean)
    assert losstags.encode(LossSum.of([math.inf, 1.0]))["loss_sum"] == "1.0 inf"
    assert losstags.encode(LossSum()) == {"loss_sum": "", "n_loss": 0}
    assert losstags.decode({}) == LossSum()  # a relay's contribution: no loss


def test_malformed_loss_tags_are_refused_naming_the_tag() -> None:
    refused = [{"loss_sum": 7.5, "n_loss": 2}, {"loss_sum": "7.5 x", "n_loss": 2}, {"loss_sum": "1e300", "n_loss": 1},
               {"loss_sum": "5e4", "n_loss": 2}, {"loss_sum": "1.0", "n_loss": 0}, {"loss_sum": "1 " * 65, "n_loss": 2},
               {"loss_sum": "1" * 129, "n_loss": 2}, {"loss_sum": "1.0", "n_loss": 3}]
    for tags in refused:
        reason = check_tags(tags, 2, 32)
        assert ("loss_sum" in reason or "partials" in reason or "n_loss" in reason), (tags, reason)
    assert check_tags({"loss_sum": "7.5 1e-20", "n_loss": 2, "tokens": 64}, 2, 32) == ""


def test_the_ledger_sums_its_losses_exactly_in_any_completion_order() -> None:
    values = [_f32(x) for x in (5.51, 0.0001, 5.49, 1e-7, 4.8)]
    totals = set()
    for seed in range(20):
        ledger = IterationLedger(3, len(values))
        order = list(range(len(values)))
        random.Random(seed).shuffle(order)
        for i in order:
            ledger.tail_done(i, values[i])
        totals.add(ledger.loss_sum().total)
    assert totals == {math.fsum(values)}


class _Closing:
    def __init__(self) -> None:
        self.sent: list[Closed] = []

    async def broadcast(self, closed: Closed, stages: object = None) -> None:
        self.sent.append(closed)


def _role(closing: _Closing) -> HolderRole:
    spec = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2)
    return HolderRole(None, spec=spec, routing=None, recovery=None, closing=closing, clip=None,  # type: ignore[arg-type]
                      online_nodes=lambda: 1, data=None, events=None, report_every_s=1.0)  # type: ignore[arg-type]


def _gathered(tags: dict[str, dict]) -> Gathered:
    return Gathered(4, tuple(sorted(tags)), tags, torch.zeros(1), 0, 0.0, "fast", (), 0.0)


def test_a_data_holder_reports_the_same_swarm_loss_whatever_order_the_contributions_came_in() -> None:
    rng = random.Random(4)  # each holder: a fresh microbatch's loss and a memorized one's (see above)
    holders = {"12D3KooWHx" + "abcde"[d]: [_f32(rng.uniform(0.5, 6.0)), _f32(10 ** rng.uniform(-14, -8))]
               for d in range(5)}
    every = [x for losses in holders.values() for x in losses]
    reports = []
    for seed in range(8):
        names = list(holders)
        random.Random(seed).shuffle(names)
        tags = {n: {**losstags.encode(LossSum.of(holders[n])), "tokens": 10} for n in names}
        closing = _Closing()
        asyncio.run(_role(closing).clip_norm(4, _gathered(tags)))
        reports.append(closing.sent[0])
    naive = {sum(sum(holders[n]) for n in random.Random(seed).sample(list(holders), 5)) for seed in range(8)}
    assert len(naive) > 1  # adding the holders' sums in arrival order would differ from run to run
    assert {r.loss for r in reports} == {math.fsum(every) / len(every)}
    assert {r.microbatches for r in reports} == {len(every)}
