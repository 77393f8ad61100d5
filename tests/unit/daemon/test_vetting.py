"""Vetting of contributions: checks before acknowledgement, the admission of members and signatures, and
the step's screening against the replicas' medians (honest replicas with gradients of similar size pass,
poison does not; an honest spike past the factor does not pass either, and no screen keeps everything)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.aggregation.admission import Admission
from gwtfp2p.daemon.aggregation.vetting import check_contribution, check_tags, screen
from gwtfp2p.daemon.swarm.peers import PeerBook
from gwtfp2p.daemon.wire import CONTRIB, AggMessage
from gwtfp2p.dht import NodeRecord
from gwtfp2p.dht.identity import NodeKey
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.fixedpoint import BOUND_LIMIT, FixedPointSum

pytestmark = pytest.mark.timeout(120)
NUMEL = 2000
RUN = "0123456789abcdef"
FACTOR = RunSpec().screen_factor


def contribution(name: str, grads: list[torch.Tensor]) -> GradContribution:
    total = FixedPointSum(NUMEL)
    for g in grads:
        total.add(g)
    return GradContribution(name, total.total.clone(), len(grads), total.bound)


def honest_replicas(seed: int, counts: list[int], signal: float = 1.0, noise: float = 1.0) -> list[GradContribution]:
    """Replicas whose microbatch gradients share a direction (``signal``) plus per-microbatch noise, with
    per-microbatch scales varying 3x as real losses do."""
    rng = torch.Generator().manual_seed(seed)
    direction = torch.randn(NUMEL, generator=rng)
    out = []
    for r, count in enumerate(counts):
        grads = [(signal * direction + noise * torch.randn(NUMEL, generator=rng))
                 * (0.5 + 1.5 * torch.rand(1, generator=rng)) for _ in range(count)]
        out.append(contribution(f"r{r}", grads))
    return out


def scaled(c: GradContribution, factor: int, name: str = "evil") -> GradContribution:
    return GradContribution(name, c.grad_sum * factor, c.count, min(abs(factor) * c.bound, BOUND_LIMIT))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.lists(st.integers(0, 16), min_size=1, max_size=6),
       st.sampled_from([0.0, 0.3, 1.0, 3.0]))
def test_honest_replicas_are_never_excluded(seed: int, counts: list[int], signal: float) -> None:
    replicas = honest_replicas(seed, counts, signal=signal)
    result = screen(replicas, FACTOR)
    assert result.excluded == {} and result.kept == tuple(c.replica_id for c in replicas)


@pytest.mark.parametrize("honest", [1, 2, 3])
def test_a_thousand_times_the_negated_sum_is_excluded(honest: int) -> None:
    replicas = honest_replicas(7, [4] * honest)
    poison = scaled(replicas[0], -1000)
    result = screen([*replicas, poison], FACTOR)
    assert set(result.excluded) == {"evil"} and "median" in result.excluded["evil"]


def test_a_sign_flipped_copy_is_trimmed_with_three_replicas() -> None:
    replicas = honest_replicas(3, [4, 4], signal=1.0, noise=0.5)
    flipped = scaled(replicas[0], -1)
    assert set(screen([*replicas, flipped], FACTOR).excluded) == {"evil"}


def test_inflated_counts_gain_nothing_and_sums_of_nothing_are_excluded() -> None:
    replicas = honest_replicas(5, [3, 4, 5])
    inflated = GradContribution("evil", replicas[0].grad_sum * -100, 300, min(replicas[0].bound * 100, BOUND_LIMIT))
    assert "evil" in screen([*replicas, inflated], FACTOR).excluded  # 300 microbatches do not license 100x the norm
    nothing = GradContribution("empty", replicas[0].grad_sum, 0, replicas[0].bound)
    assert set(screen([*replicas, nothing], FACTOR).excluded) == {"empty"}


def test_the_screen_does_not_depend_on_the_order() -> None:
    replicas = [*honest_replicas(11, [2, 5, 3, 1]), scaled(honest_replicas(12, [4])[0], -1000)]
    expected = screen(replicas, FACTOR).excluded
    for seed in range(5):
        shuffled = replicas[:]
        random.Random(seed).shuffle(shuffled)
        assert screen(shuffled, FACTOR).excluded == expected


def spiked(seed: int, counts: list[int], spike: float) -> list[GradContribution]:
    """Honest replicas as above, one microbatch of the first ``spike`` times the size of the others (as
    the demo's iteration 24: one microbatch's stage-1 gradient 350x the others')."""
    rng = torch.Generator().manual_seed(seed)
    direction = torch.randn(NUMEL, generator=rng)
    out = []
    for r, count in enumerate(counts):
        grads = [direction + torch.randn(NUMEL, generator=rng) for _ in range(count)]
        if r == 0:
            grads[0] = grads[0] * spike
        out.append(contribution(f"r{r}", grads))
    return out


def test_an_honest_spike_past_the_factor_is_excluded_and_no_screen_keeps_it() -> None:
    replicas = spiked(4, [2, 6], spike=350.0)
    assert set(screen(replicas, FACTOR).excluded) == {"r0"}  # the cost of the screen (docs/security.md)
    assert screen(replicas, 0).excluded == {} and screen(replicas, 0).kept == ("r0", "r1")
    assert screen(spiked(4, [2, 6], spike=20.0), FACTOR).excluded == {}


def test_no_screen_trusts_every_valid_contribution() -> None:
    replicas = honest_replicas(7, [4, 4])
    poison = scaled(replicas[0], -1000)
    assert screen([*replicas, poison], 0).excluded == {}
    nothing = GradContribution("empty", replicas[0].grad_sum, 0, replicas[0].bound)
    assert set(screen([*replicas, nothing], 0).excluded) == {"empty"}  # invalid, not a judgement


def test_contributions_are_checked_before_they_are_taken() -> None:
    good = honest_replicas(1, [2])[0]
    assert check_contribution(good, NUMEL) == ""
    over = GradContribution("x", good.grad_sum, 2, 1)
    assert "bound" in check_contribution(over, NUMEL)
    assert "int64" in check_contribution(GradContribution("x", good.grad_sum.float(), 2, good.bound), NUMEL)
    assert check_contribution(GradContribution("x", good.grad_sum, -1, good.bound), NUMEL)
    assert "zero microbatches" in check_contribution(GradContribution("x", good.grad_sum, 0, good.bound), NUMEL)
    assert check_tags({"loss_sum": "7.5", "n_loss": 2, "tokens": 64}, 2, 32) == ""
    for tags in ({"loss_sum": "1e300", "n_loss": 2}, {"n_loss": 3}, {"n_loss": 2, "tokens": 65},
                 {"loss_sum": 7.5, "n_loss": 2}, {"weird": 1}, {"n_loss": True}):
        assert check_tags(tags, 2, 32), tags


class Book:
    """PeerBook over a mutable dict of records (the view)."""

    def __init__(self, me: NodeKey) -> None:
        self.records: dict[str, NodeRecord] = {}
        self.book = PeerBook(me.peer_id, me, lambda: self.records, signing=True)

    def add(self, key: NodeKey, stage: int) -> None:
        import base64
        self.records[key.peer_id] = NodeRecord(run_id=RUN, peer_id=key.peer_id, role="relay" if stage else "data",
                                               stage=stage, state="online",
                                               public_key=base64.b64encode(key.public_key_proto).decode())


def test_admission_takes_signed_contributions_of_members_only() -> None:
    me, friend, crashed, stranger = (NodeKey.generate() for _ in range(4))
    mine, theirs, strangers = Book(me), Book(friend), Book(stranger)
    for book in (mine, theirs, strangers):
        book.add(friend, 1)
        book.add(crashed, 1)
    admission = Admission(me.peer_id, 1, mine.book, numel=NUMEL, tokens_per_microbatch=32)
    crashed_admission = Admission(crashed.peer_id, 1, PeerBook(crashed.peer_id, crashed, lambda: {}, True),
                                  numel=NUMEL, tokens_per_microbatch=32)
    c = honest_replicas(2, [3])[0]

    class Own:  # a contribution as it travels
        payload, count, bound = c.grad_sum, c.count, c.bound

    async def scenario() -> list[str]:
        tags = await crashed_admission.signed_tags(4, Own, {})
        forwarded = AggMessage(CONTRIB, 4, (), origin=crashed.peer_id, count=c.count, bound=c.bound, tags=tags)
        tampered = AggMessage(CONTRIB, 4, (), origin=crashed.peer_id, count=c.count + 1, bound=c.bound, tags=tags)
        unsigned = AggMessage(CONTRIB, 4, (), origin=friend.peer_id, count=c.count, bound=c.bound, tags={})
        return [await admission.admit(friend.peer_id, forwarded, c.grad_sum),
                await admission.admit(friend.peer_id, tampered, c.grad_sum),
                await admission.admit(friend.peer_id, unsigned, c.grad_sum),
                await admission.admit(stranger.peer_id, forwarded, c.grad_sum),
                await admission.admit(friend.peer_id, AggMessage("query", 4, ()), torch.zeros(0))]

    ok, tampered, unsigned, stranger_says, query = asyncio.run(scenario())
    assert ok == "" and query == ""
    assert "signature" in tampered and "signature" in unsigned
    assert "does not serve" in stranger_says
    mine.records.pop(crashed.peer_id)  # its record expired: what it signed still verifies
    assert admission.eligible(crashed.peer_id)
