"""StageExecutor and DataHolderExecutor: per-microbatch protocol, dedupe, drop, recompute, memory."""

from __future__ import annotations

import copy

import pytest
import torch

from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.harness import PipelineHarness
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.ledger import UnknownMicrobatch
from gwtfp2p.model.partition import split_model
from gwtfp2p.model.replica import make_data_holder_executor, make_stage_executor
from tests.unit.model.tiny import VOCAB, tiny_spec


def _parts(family="gpt2", n_stages=2, dropout=0.0, **spec_fields):
    spec = tiny_spec(family, n_stages, **spec_fields)
    model = build_from_spec(spec, VOCAB, dropout=dropout)
    return spec, model, split_model(model, n_stages)


def _ids(seed=0, spec=None):
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_one_microbatch_gives_the_unsplit_gradients(family):
    spec, model, parts = _parts(family, 2)
    ref = copy.deepcopy(model)
    dh = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    stages = [StageExecutor(copy.deepcopy(m), spec, k + 1) for k, m in enumerate(parts.stages)]
    ids = _ids()
    hidden = dh.head_forward("m0", ids)
    for stage in stages:
        hidden = stage.forward("m0", hidden)
    loss, grad = dh.tail_backward("m0", hidden)
    for stage in reversed(stages):
        grad = stage.backward("m0", grad)
    dh.head_backward("m0", grad)
    out = ref(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    assert loss == pytest.approx(float(out.loss.detach()), abs=1e-6)
    ref_groups = split_model(ref, 2).groups()
    ours = [dh.params] + [s.params for s in stages]
    for mine, theirs in zip(ours, ref_groups, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-5)
    assert dh.count == 1 and all(s.count == 1 for s in stages)


def test_duplicate_forward_and_backward_count_once():
    spec, _, parts = _parts()
    stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    x = torch.randn(2, 12, 32)
    g = torch.randn(2, 12, 32)
    y1 = stage.forward("a", x)
    y2 = stage.forward("a", x)  # resend while pending: recompute, replace state
    assert torch.equal(y1, y2) and stage.status("a") == "pending"
    gx1 = stage.backward("a", g)
    grads_once = stage.grad_contribution("r").grad_sum
    gx2 = stage.backward("a", g)  # duplicate backward: same answer, nothing added
    y3 = stage.forward("a", x)  # forward after done: recomputed, no state kept
    assert torch.equal(gx1, gx2) and torch.equal(y1, y3)
    assert stage.status("a") == "done" and stage.count == 1
    assert torch.equal(stage.grad_contribution("r").grad_sum, grads_once)
    assert stage.memory_stats()["saved_activation_bytes"] == 0


def test_drop_frees_state_and_unknown_ids_raise():
    spec, _, parts = _parts()
    stage = StageExecutor(copy.deepcopy(parts.stages[1]), spec, 2)
    stage.forward("a", torch.randn(2, 12, 32))
    stats = stage.memory_stats()
    assert stats["saved_activation_bytes"] > 0 and stats["peak_saved_activation_bytes"] > 0
    assert stage.drop("a") and not stage.drop("a")
    assert stage.memory_stats()["saved_activation_bytes"] == 0
    with pytest.raises(UnknownMicrobatch):
        stage.backward("a", torch.randn(2, 12, 32))
    stage.forward("b", torch.randn(2, 12, 32))
    with pytest.raises(ValueError, match="shape"):
        stage.backward("b", torch.randn(2, 11, 32))
    assert stage.status("b") == "pending" and stage.count == 0
    result = stage.apply_step([stage.grad_contribution("r")])
    assert result.dropped_pending == 1 and not result.stepped and stage.status("b") == "unknown"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_seeded_dropout_recompute_is_bitwise_on_any_replica(family):
    spec, _, parts = _parts(family, 1, dropout=0.3)
    a = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    b = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    x = torch.randn(2, 12, 32)
    ya, yb = a.forward("mb", x), b.forward("mb", x)
    torch.rand(5)  # other random work in between changes nothing
    yc = a.forward("mb", x)
    assert torch.equal(ya, yb) and torch.equal(ya, yc)
    assert not torch.equal(ya, a.forward("other", x))  # the mask depends on the microbatch id
    dh_a = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    dh_b = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    ids = _ids()
    assert torch.equal(dh_a.head_forward("mb", ids), dh_b.head_forward("mb", ids))


def test_data_holder_dedupes_tail_and_head_and_drops():
    spec, _, parts = _parts()
    dh = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    ids = _ids()
    h = dh.head_forward("m", ids)
    loss1, g1 = dh.tail_backward("m", h)
    loss2, g2 = dh.tail_backward("m", h)
    assert loss1 == loss2 and torch.equal(g1, g2) and dh.count == 1 and dh.loss("m") == loss1
    dh.head_backward("m", torch.ones_like(h))
    after_head = dh.grad_contribution("d").grad_sum
    dh.head_backward("m", torch.ones_like(h))
    assert torch.equal(after_head, dh.grad_contribution("d").grad_sum)
    dh.head_forward("gone", ids)
    assert dh.drop("gone")
    with pytest.raises(UnknownMicrobatch):
        dh.tail_backward("gone", h)
    with pytest.raises(UnknownMicrobatch):
        dh.head_backward("gone", h)


def test_gradients_stay_views_of_the_flat_buffer():
    spec, _, parts = _parts("llama")
    stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    for i in range(3):
        stage.forward(f"m{i}", torch.randn(2, 12, 32))
        stage.backward(f"m{i}", torch.randn(2, 12, 32))
    contribution = stage.grad_contribution("r")
    manual = torch.cat([p.grad.reshape(-1) for p in stage.params])
    assert torch.equal(contribution.grad_sum, manual) and contribution.count == 3
    stage.apply_step([contribution])
    assert all(p.grad is not None and not p.grad.any() for p in stage.params)


def test_nodes_build_their_part_with_the_runs_initial_weights():
    spec = tiny_spec("llama", 3, partition=(2, 1, 1))
    harness = PipelineHarness(spec, VOCAB, replicas=2)
    for k in range(1, 4):
        mine = make_stage_executor(spec, k, VOCAB)
        assert mine.state_hash() == harness.stages[k - 1][1].state_hash()
        assert len(mine.module.layers) == spec.partition[k - 1]
    assert make_data_holder_executor(spec, VOCAB).state_hash() == harness.data_holders[0].state_hash()
    with pytest.raises(ValueError):
        make_stage_executor(spec, 4, VOCAB)


def test_malformed_tensors_from_the_network_are_refused():
    spec, _, parts = _parts()
    stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    dh = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    for bad in (torch.randn(2, 12, 31), torch.randn(12, 32), torch.ones(2, 12, 32, dtype=torch.long)):
        with pytest.raises(ValueError):
            stage.forward("x", bad)
    for bad in (torch.full((2, 12), VOCAB), torch.randn(2, 12), torch.zeros(2, 3, 4, dtype=torch.long)):
        with pytest.raises(ValueError):
            dh.head_forward("x", bad)
    dh.head_forward("ok", _ids())
    with pytest.raises(ValueError):
        dh.tail_backward("ok", torch.randn(2, 11, 32))
    assert stage.status("x") == "unknown" and dh.count == 0
