"""Aggregation (canonical order, validation, per-stage clipping) and state bytes / hashes."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.model.aggregate import AggregationError, GradContribution, mean_gradient, reduce_contributions
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.partition import split_model
from gwtfp2p.model.state import StateError
from tests.unit.model.tiny import VOCAB, tiny_spec


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(5)), st.lists(st.integers(0, 9), min_size=5, max_size=5))
def test_reduction_is_bitwise_independent_of_arrival_order(order, counts):
    gen = torch.Generator().manual_seed(0)
    contributions = [GradContribution(f"r{i}", torch.randn(50, generator=gen) * 10 ** (i - 2), counts[i])
                     for i in range(5)]
    canonical, n = reduce_contributions(contributions, numel=50, dtype=torch.float32)
    shuffled, m = reduce_contributions([contributions[i] for i in order], numel=50, dtype=torch.float32)
    assert torch.equal(canonical, shuffled) and n == m == sum(counts)


def test_mean_and_validation():
    a = GradContribution("a", torch.full((3,), 6.0), 2)
    b = GradContribution("b", torch.full((3,), 3.0), 1)
    mean, count = mean_gradient([b, a], numel=3, dtype=torch.float32)
    assert torch.equal(mean, torch.full((3,), 3.0)) and count == 3
    zero, none = mean_gradient([GradContribution("a", torch.zeros(3), 0)], numel=3, dtype=torch.float32)
    assert none == 0 and not zero.any()
    for bad in ([a, a], [GradContribution("c", torch.zeros(4), 1)],
                [GradContribution("c", torch.zeros(3, dtype=torch.float64), 1)],
                [GradContribution("c", torch.zeros(3), -1)]):
        with pytest.raises(AggregationError):
            reduce_contributions(bad, numel=3, dtype=torch.float32)


def _stage_replicas(n, family="gpt2", **spec_fields):
    spec = tiny_spec(family, 2, **spec_fields)
    parts = split_model(build_from_spec(spec, VOCAB), 2)
    return spec, parts, [StageExecutor(copy.deepcopy(parts.stages[1]), spec, 2) for _ in range(n)]


def _work(replica, ids, seed):
    gen = torch.Generator().manual_seed(seed)
    for mb in ids:
        replica.forward(mb, torch.randn(2, 12, 32, generator=gen))
        replica.backward(mb, torch.randn(2, 12, 32, generator=gen))


def test_per_stage_clipping_bounds_the_update_norm():
    spec, _, (replica,) = _stage_replicas(1, grad_clip=1e-3)
    _work(replica, ["a", "b"], seed=1)
    contribution = replica.grad_contribution("r0")
    expected_norm = float((contribution.grad_sum / 2).norm())
    result = replica.apply_step([contribution])
    assert result.clipped and result.stepped and result.count == 2
    assert result.grad_norm == pytest.approx(expected_norm, rel=1e-5)
    clipped = [state["exp_avg"] / (1 - spec.beta1) for state in replica.optimizer.state.values()]
    assert float(torch.cat([m.reshape(-1) for m in clipped]).norm()) == pytest.approx(1e-3, rel=1e-3)


def test_replicas_step_identically_even_after_one_is_lost():
    _, _, replicas = _stage_replicas(3, "llama")
    for i, replica in enumerate(replicas):
        _work(replica, [f"m{i}a", f"m{i}b"][: i + 1], seed=i)
    contributions = [r.grad_contribution(f"r{i}") for i, r in enumerate(replicas)]
    survivors = replicas[:2]  # replica 2 died during the all-reduce: retried without it
    results = [r.apply_step(list(reversed(contributions[:2]))) for r in survivors]
    assert results[0].state_hash == results[1].state_hash and results[0].count == 3
    assert replicas[2].state_hash() != results[0].state_hash


def test_state_bytes_roundtrip_into_a_fresh_replica():
    _, _, (a, fresh) = _stage_replicas(2)
    _work(a, ["x"], seed=3)
    a.apply_step([a.grad_contribution("a")])
    assert fresh.state_hash() != a.state_hash()
    digest = fresh.load_state_bytes(a.state_bytes(), expected_hash=a.state_hash())
    assert digest == a.state_hash() == fresh.state_hash() and len(digest) == 16
    for replica in (a, fresh):  # both keep training in lockstep
        _work(replica, ["y"], seed=4)
    contributions = [a.grad_contribution("a"), fresh.grad_contribution("b")]
    assert a.apply_step(contributions).state_hash == fresh.apply_step(contributions).state_hash


def test_state_bytes_are_checked_before_loading():
    spec, parts, (a, b) = _stage_replicas(2)
    _work(a, ["x"], seed=3)
    a.apply_step([a.grad_contribution("a")])
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
    a.apply_step([a.grad_contribution("d0")])
    b.load_state_bytes(a.state_bytes())
    assert b.state_hash() == a.state_hash() and b.weights_hash() == a.weights_hash()
    assert b.module.head.tokens.weight is b.module.tail.lm_head.weight
