"""Aggregation (exact reduction, validation, clipping by the global or the part's norm) and state bytes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.model.aggregate import AggregationError, GradContribution, mean_gradient, reduce_contributions
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.fixedpoint import BOUND_LIMIT, FixedPointSum
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.partition import split_model
from gwtfp2p.model.state import StateError
from tests.unit.model.tiny import VOCAB, tiny_spec


def _fixed(values: torch.Tensor) -> tuple[torch.Tensor, int]:
    acc = FixedPointSum(values.numel())
    acc.add(values)
    return acc.total, acc.bound


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(5)), st.lists(st.integers(0, 9), min_size=5, max_size=5))
def test_reduction_is_bitwise_independent_of_arrival_order(order, counts):
    gen = torch.Generator().manual_seed(0)
    sums = [_fixed(torch.randn(50, generator=gen) * 10 ** (i - 2)) for i in range(5)]
    contributions = [GradContribution(f"r{i}", total, counts[i], bound) for i, (total, bound) in enumerate(sums)]
    canonical, n = mean_gradient(contributions, numel=50)
    shuffled, m = mean_gradient([contributions[i] for i in order], numel=50)
    assert n == m == sum(counts)
    assert torch.equal(canonical, shuffled) or (n == 0 and not shuffled.any())


def test_mean_and_validation():
    a = GradContribution("a", torch.full((3,), 6 << 40), 2, 6 << 40)
    b = GradContribution("b", torch.full((3,), 3 << 40), 1, 3 << 40)
    mean, count = mean_gradient([b, a], numel=3)
    assert torch.equal(mean, torch.full((3,), 3.0)) and count == 3 and mean.dtype == torch.float32
    zero, none = mean_gradient([GradContribution("a", torch.zeros(3, dtype=torch.int64), 0)], numel=3)
    assert none == 0 and not zero.any()
    overflow, _ = mean_gradient([a, GradContribution("c", torch.zeros(3, dtype=torch.int64), 1, BOUND_LIMIT)],
                                numel=3)
    assert overflow.isnan().all()  # a non-finite or too large gradient somewhere: no step
    ints = torch.zeros(3, dtype=torch.int64)
    for bad in ([a, a], [GradContribution("c", torch.zeros(4, dtype=torch.int64), 1)],
                [GradContribution("c", torch.zeros(3), 1)],  # floats: not a fixed-point sum
                [GradContribution("c", ints, -1)], [GradContribution("c", ints, 1, -1)],
                [GradContribution("c", ints, 1, BOUND_LIMIT + 1)],
                [GradContribution("c", torch.full((3,), 5), 1, 4)]):  # values beyond the bound it claims
        with pytest.raises(AggregationError):
            reduce_contributions(bad, numel=3)


def _stage_replicas(n, family="gpt2", **spec_fields):
    spec = tiny_spec(family, 2, **spec_fields)
    parts = split_model(build_from_spec(spec, VOCAB), 2)
    return spec, parts, [StageExecutor(copy.deepcopy(parts.stages[1]), spec, 2) for _ in range(n)]


def _step(replica, contributions):
    """Reduce and step as if the other parts' squared norms added up to 1."""
    mean, count = replica.reduce(contributions)
    return replica.apply_mean(mean, count, total_sq_norm=replica.grad_sq_norm(mean) + 1.0)


def _work(replica, ids, seed):
    gen = torch.Generator().manual_seed(seed)
    for mb in ids:
        replica.forward(mb, torch.randn(2, 12, 32, generator=gen))
        replica.backward(mb, torch.randn(2, 12, 32, generator=gen))


def _first_moment_norm(replica, spec) -> float:
    """The first AdamW step's update direction before normalization: the clipped gradient's norm."""
    moments = [state["exp_avg"] / (1 - spec.beta1) for state in replica.optimizer.state.values()]
    return float(torch.cat([m.reshape(-1) for m in moments]).norm())


def test_per_part_clipping_bounds_the_update_norm():
    spec, _, (replica,) = _stage_replicas(1, grad_clip=1e-3, clip_mode="per_part")
    _work(replica, ["a", "b"], seed=1)
    mean, count = replica.reduce([replica.grad_contribution("r0")])
    with pytest.raises(ValueError, match="per_part"):
        replica.apply_mean(mean, count, total_sq_norm=1.0)
    result = replica.apply_mean(mean, count)
    assert result.clipped and result.stepped and result.count == 2 and result.clip_norm == result.grad_norm
    assert result.grad_norm == pytest.approx(float(mean.double().norm()), rel=1e-12)
    assert _first_moment_norm(replica, spec) == pytest.approx(1e-3, rel=1e-3)


def test_global_clipping_scales_by_the_whole_models_norm():
    spec, _, (replica,) = _stage_replicas(1, grad_clip=1e-3)
    _work(replica, ["a"], seed=1)
    mean, count = replica.reduce([replica.grad_contribution("r0")])
    own = replica.grad_sq_norm(mean)
    with pytest.raises(ValueError, match="total_sq_norm"):
        replica.apply_mean(mean, count)
    with pytest.raises(ValueError, match="below this part's own"):  # the total must include this part
        replica.apply_mean(mean, count, total_sq_norm=own / 2)
    total = own + 3 * own  # the other parts hold three times this part's squared norm
    result = replica.apply_mean(mean, count, total_sq_norm=total)
    assert result.clipped and result.clip_norm == math.sqrt(total) and result.grad_norm == math.sqrt(own)
    assert result.clip_scale == pytest.approx(1e-3 / math.sqrt(total), rel=1e-4)
    assert _first_moment_norm(replica, spec) == pytest.approx(1e-3 / 2, rel=1e-3)  # this part's share


def test_a_non_finite_global_norm_skips_every_parts_step():
    _, _, (replica,) = _stage_replicas(1)
    _work(replica, ["a"], seed=1)
    before = replica.state_hash()
    mean, count = replica.reduce([replica.grad_contribution("r0")])
    result = replica.apply_mean(mean, count, total_sq_norm=math.inf)  # another part overflowed
    assert not result.stepped and result.state_hash == before and result.count == 1


def test_an_infinite_microbatch_gradient_makes_the_sum_unrepresentable():
    _, _, (replica,) = _stage_replicas(1)
    replica.forward("a", torch.randn(2, 12, 32))
    replica.backward("a", torch.full((2, 12, 32), 1e38))  # parameter gradients overflow to inf
    contribution = replica.grad_contribution("r0")
    assert contribution.bound == BOUND_LIMIT
    mean, count = replica.reduce([contribution])
    assert math.isnan(replica.grad_sq_norm(mean))
    assert not replica.apply_mean(mean, count, total_sq_norm=replica.grad_sq_norm(mean)).stepped


def test_replicas_step_identically_even_after_one_is_lost():
    _, _, replicas = _stage_replicas(3, "llama")
    for i, replica in enumerate(replicas):
        _work(replica, [f"m{i}a", f"m{i}b"][: i + 1], seed=i)
    contributions = [r.grad_contribution(f"r{i}") for i, r in enumerate(replicas)]
    survivors = replicas[:2]  # replica 2 died during the all-reduce: retried without it
    total = survivors[0].grad_sq_norm(survivors[0].reduce(contributions[:2])[0]) + 1.0
    results = [r.apply_step(list(reversed(contributions[:2])) if i else contributions[:2], total_sq_norm=total)
               for i, r in enumerate(survivors)]
    assert results[0].state_hash == results[1].state_hash and results[0].count == 3
    assert replicas[2].state_hash() != results[0].state_hash


def test_state_bytes_roundtrip_into_a_fresh_replica():
    _, _, (a, fresh) = _stage_replicas(2)
    _work(a, ["x"], seed=3)
    _step(a, [a.grad_contribution("a")])
    assert fresh.state_hash() != a.state_hash()
    digest = fresh.load_state_bytes(a.state_bytes(), expected_hash=a.state_hash())
    assert digest == a.state_hash() == fresh.state_hash() and len(digest) == 16
    for replica in (a, fresh):  # both keep training in lockstep
        _work(replica, ["y"], seed=4)
    contributions = [a.grad_contribution("a"), fresh.grad_contribution("b")]
    steps = [_step(r, contributions) for r in (a, fresh)]
    assert steps[0].state_hash == steps[1].state_hash


def test_state_bytes_are_checked_before_loading():
    spec, parts, (a, b) = _stage_replicas(2)
    _work(a, ["x"], seed=3)
    _step(a, [a.grad_contribution("a")])
    data, before = a.state_bytes(), b.state_hash()
    with pytest.raises(StateError, match="expected"):
        b.load_state_bytes(data, expected_hash="0" * 16)
    with pytest.raises(StateError):
        b.load_state_bytes(data[: len(data) // 2])
    other_stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    with pytest.raises(StateError, match="stage2"):
        other_stage.load_state_bytes(data)
    assert b.state_hash() == before


def test_data_holder_state_keeps_the_tied_embedding():
    spec = tiny_spec("gpt2", 1)
    parts = split_model(build_from_spec(spec, VOCAB), 1)
    a = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    b = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    h = a.head_forward("m", torch.randint(0, VOCAB, (2, 12)))
    _, g = a.tail_backward("m", h)
    a.head_backward("m", g)
    _step(a, [a.grad_contribution("d0")])
    b.load_state_bytes(a.state_bytes())
    assert b.state_hash() == a.state_hash() and b.weights_hash() == a.weights_hash()
    assert b.module.head.tokens.weight is b.module.tail.lm_head.weight
