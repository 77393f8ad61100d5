"""Exact gradient sums (fixed point), exact loss sums, and the deterministic norms, checked against
independent references: Python's integers and ``fractions``, ``math.fsum``, a literal tree."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.model.fixedpoint import BOUND_LIMIT, FRACTION_BITS, FixedPointSum, to_fixed, to_float
from gwtfp2p.model.gradnorm import BLOCK, clip_scale, global_sq_norm, sq_norm, tensor_sq_norm, tensor_sq_norms
from gwtfp2p.model.losssum import LossSum

float32s = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e5, max_value=1e5)
small_float32s = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e3, max_value=1e3)


@settings(max_examples=60, deadline=None)
@given(st.lists(float32s, min_size=1, max_size=40))
def test_to_fixed_is_pythons_exact_round_half_even(values):
    fixed, peak = to_fixed(torch.tensor(values, dtype=torch.float32))
    expected = [round(Fraction(v) * 2**FRACTION_BITS) for v in values]  # Fraction: exact; round: half-even
    assert fixed.tolist() == expected and peak == max(abs(x) for x in expected)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(small_float32s, min_size=6, max_size=6), min_size=1, max_size=8), st.randoms(),
       st.integers(1, 4))
def test_fixed_point_sums_do_not_depend_on_order_or_split(gradients, rng, parts):
    tensors = [torch.tensor(g, dtype=torch.float32) for g in gradients]
    whole = FixedPointSum(6)
    for t in tensors:
        whole.add(t)
    shuffled = rng.sample(tensors, len(tensors))
    pieces = [FixedPointSum(6) for _ in range(parts)]
    for i, t in enumerate(shuffled):
        pieces[i % parts].add(t)
    merged = sum(p.total for p in pieces)
    assert torch.equal(merged, whole.total) and sum(p.bound for p in pieces) == whole.bound
    mean = to_float(whole.total, len(tensors))
    exact = [float(np.float32(float(Fraction(int(s), 2**FRACTION_BITS * len(tensors))))) for s in whole.total]
    # the spec: float64(total) / (count * 2**40), then float32; |sums| < 8 * 1e3 * 2**40 < 2**53 here
    assert mean.tolist() == exact


def test_non_finite_or_huge_gradients_are_not_representable():
    acc = FixedPointSum(3)
    acc.add(torch.tensor([1.0, 2.0, 3.0]))
    assert acc.representable and acc.bound == 3 << FRACTION_BITS
    for bad in (torch.tensor([0.0, math.inf, 1.0]), torch.tensor([math.nan, 0.0, 0.0]),
                torch.tensor([2.0 ** (62 - FRACTION_BITS), 0.0, 0.0])):
        other = FixedPointSum(3)
        other.add(bad)
        assert not other.representable and other.bound == BOUND_LIMIT
    with pytest.raises(ValueError):
        acc.add(torch.zeros(4))
    with pytest.raises(ValueError):
        to_float(acc.total, 0)


def test_sparse_rows_and_slices_add_like_the_dense_gradient():
    gen = torch.Generator().manual_seed(3)
    matrix = torch.zeros(6, 4)
    rows = torch.tensor([1, 4, 5])
    matrix[rows] = torch.randn(3, 4, generator=gen)
    bias = torch.randn(5, generator=gen)
    dense, sparse = FixedPointSum(3 + 24 + 5), FixedPointSum(3 + 24 + 5)
    dense.add(torch.cat([torch.zeros(3), matrix.reshape(-1), bias]))
    sparse.add_rows(3, (6, 4), rows, matrix[rows])
    sparse.add(bias, start=27)
    assert torch.equal(dense.total, sparse.total)
    for bad in (lambda: sparse.add(bias, start=28),  # past the end
                lambda: sparse.add_rows(3, (6, 4), torch.tensor([6]), matrix[:1]),  # row 6 of 6
                lambda: sparse.add_rows(3, (6, 4), rows, matrix[:2]),  # 3 rows, 2 values
                lambda: sparse.add_rows(9, (6, 4), rows, matrix[rows])):  # the matrix runs past the end
        with pytest.raises(ValueError):
            bad()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), max_size=30), st.randoms(),
       st.integers(1, 4))
def test_loss_sums_are_exact_whatever_the_order_and_the_data_holder_split(losses, rng, holders):
    exact = float(sum((Fraction(x) for x in losses), Fraction(0)))  # correctly rounded exact sum
    shuffled = rng.sample(losses, len(losses))
    parts = [LossSum.of(shuffled[i::holders]) for i in range(holders)]
    wire = [LossSum.from_parts(list(p.partials), p.count, p.nonfinite) for p in parts]
    merged = LossSum.merge(rng.sample(wire, len(wire)))
    assert merged.total == exact == math.fsum(losses) and merged.count == len(losses)
    assert LossSum.of(losses).total == exact


def test_loss_sums_cancel_exactly_and_keep_non_finite_losses_apart():
    assert LossSum.of([1e16, 1.0, -1e16]).total == 1.0  # a float loop gives 0.0
    assert math.isinf(LossSum.of([1.0, math.inf]).total)
    assert math.isnan(LossSum.merge([LossSum.of([math.inf]), LossSum.of([-math.inf, 2.0])]).total)
    assert LossSum().mean is None and LossSum.of([1.0, 2.0]).mean == 1.5
    for partials, count in (([math.nan], 1), (["1.0"], 1), ([1.0], -1), ([True], 1), ([0.0] * 65, 1)):
        with pytest.raises(ValueError):
            LossSum.from_parts(partials, count)


def _literal_tree_sq(t: torch.Tensor) -> float:
    """The rule as written: float64 squares, blocks of BLOCK zero-padded and halved, then the block
    sums zero-padded to a power of two and halved (no shortcut for small tensors)."""
    x = t.double().reshape(-1) ** 2
    x = torch.cat([x, x.new_zeros(-len(x) % BLOCK)]).view(-1, BLOCK)
    while x.shape[1] > 1:
        x = x[:, : x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    sums = x[:, 0]
    sums = torch.cat([sums, sums.new_zeros((1 << (len(sums) - 1).bit_length()) - len(sums))])
    while len(sums) > 1:
        sums = sums[: len(sums) // 2] + sums[len(sums) // 2:]
    return float(sums[0])


def test_squared_norms_follow_the_literal_rule_and_are_accurate():
    gen = torch.Generator().manual_seed(0)
    sizes = [1, 2, 31, 32, 33, 1000, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17, 70 * BLOCK + 5]
    tensors = [torch.randn(n, generator=gen) * torch.exp(3 * torch.randn(n, generator=gen)) for n in sizes]
    batched = tensor_sq_norms(tensors)
    for t, value in zip(tensors, batched, strict=True):
        assert value == tensor_sq_norm(t) == _literal_tree_sq(t)
        exact = sum(Fraction(float(x)) ** 2 for x in t.tolist()) if t.numel() <= 5000 else None
        if exact is not None:
            assert abs(Fraction(value) - exact) <= exact * Fraction(1, 10**13)


def test_squared_norms_do_not_depend_on_threads_order_or_the_split_into_parts():
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(n, generator=gen) for n in (5, 300, 4 * BLOCK + 3, 128)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sq_norm(tensors)
        torch.set_num_threads(2)
        two = sq_norm(tensors[::-1])
    finally:
        torch.set_num_threads(before)
    parts = [sq_norm(tensors[:1]), sq_norm(tensors[1:3]), sq_norm(tensors[3:])]
    exact = math.fsum(tensor_sq_norm(t) for t in tensors)
    assert one == two == exact and global_sq_norm(random.Random(0).sample(parts, 3)) == global_sq_norm(parts)
    assert math.isnan(global_sq_norm([1.0, math.nan])) and math.isinf(global_sq_norm([math.inf, 2.0]))


def test_clip_scale():
    assert clip_scale(0.0, 1.0) == 1.0 and clip_scale(0.25, 1.0) == 1.0
    scale = clip_scale(4.0, 1.0)
    assert scale == float(np.float32(1.0 / (2.0 + 1e-6))) and scale < 0.5
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError):
            clip_scale(bad, 1.0)
