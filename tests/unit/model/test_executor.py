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


def _unsplit_fixed(model, ids) -> list[torch.Tensor]:
    """Each parameter's gradient of one microbatch in the unsplit model, in fixed point (units 2**-40)."""
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return [torch.round(p.grad * 2.0**40).to(torch.int64) for p in model.parameters()]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_exact_sums_hold_each_microbatchs_unsplit_gradient_bitwise(family):
    """Two microbatches with interleaved hops (GPT-2's tied embedding gets m1's tail and head between
    m0's): every part's exact sum is the sum of the unsplit model's per-microbatch gradients."""
    spec, model, parts = _parts(family, 2)
    ref = copy.deepcopy(model)
    dh = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    stages = [StageExecutor(copy.deepcopy(m), spec, k + 1) for k, m in enumerate(parts.stages)]
    ids = {"m0": _ids(0), "m1": _ids(1)}
    hidden = {mb: dh.head_forward(mb, x) for mb, x in ids.items()}
    for stage in stages:
        hidden = {mb: stage.forward(mb, h) for mb, h in hidden.items()}
    grads = {}
    for mb in ("m0", "m1"):
        loss, grads[mb] = dh.tail_backward(mb, hidden[mb])
        assert loss == float(ref(input_ids=ids[mb], labels=ids[mb], use_cache=False).loss.detach())
    for mb in ("m1", "m0"):
        for stage in reversed(stages):
            grads[mb] = stage.backward(mb, grads[mb])
        dh.head_backward(mb, grads[mb])
    expected = [a + b for a, b in zip(_unsplit_fixed(ref, ids["m0"]), _unsplit_fixed(ref, ids["m1"]), strict=True)]
    by_param = dict(zip((id(p) for p in ref.parameters()), expected, strict=True))
    ref_groups = split_model(ref, 2).groups()
    for part, theirs in zip([dh, *stages], ref_groups, strict=True):
        mine = part.grad_contribution("r")
        assert torch.equal(mine.grad_sum, torch.cat([by_param[id(p)].reshape(-1) for p in theirs]))
        assert mine.count == 2 and not any(p.grad.any() for p in part.params)  # the buffer is empty again


def test_a_tail_without_its_head_still_enters_the_sum():
    spec, _, parts = _parts("gpt2", 1)
    dh = DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
    stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    ids = _ids(3)
    dh.tail_backward("m", stage.forward("m", dh.head_forward("m", ids)))
    contribution = dh.grad_contribution("d")  # the head backward never came: the tail's rows alone
    tail_only = copy.deepcopy(parts.data_holder)
    tail_only.zero_grad(set_to_none=True)
    x = stage.forward("again", dh.head_forward("again", ids))
    tail_only.tail(x.requires_grad_(True), ids).backward()
    expected = torch.cat([torch.round((p.grad if p.grad is not None else torch.zeros_like(p)) * 2.0**40)
                          .to(torch.int64).reshape(-1) for p in tail_only.parameters()])
    assert torch.equal(contribution.grad_sum, expected) and contribution.count == 1


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
    result = stage.apply_step([stage.grad_contribution("r")], total_sq_norm=0.0)
    assert result.dropped_pending == 1 and not result.stepped and stage.status("b") == "unknown"


def test_discarded_gradients_never_reach_a_later_contribution():
    """A re-synced replica forgets what it gathered for the iteration it no longer steps: its next
    contribution holds only the later microbatches, bitwise as a fresh replica's."""
    spec, _, parts = _parts()
    stale = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    fresh = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    x, g = torch.randn(2, 12, 32), torch.randn(2, 12, 32)
    stale.forward("old", x)
    stale.backward("old", g)
    stale.forward("pending", x)
    assert stale.discard_gradients() == 1 and stale.count == 0 and stale.status("pending") == "unknown"
    for executor in (stale, fresh):
        executor.forward("new", x * 2)
        executor.backward("new", g * 2)
    ours, theirs = stale.grad_contribution("r"), fresh.grad_contribution("r")
    assert ours.count == theirs.count == 1 and torch.equal(ours.grad_sum, theirs.grad_sum)


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


def test_gradients_stay_views_of_the_flat_buffer_and_leave_it_at_each_backward():
    spec, _, parts = _parts("llama")
    stage = StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1)
    for i in range(3):
        stage.forward(f"m{i}", torch.randn(2, 12, 32))
        stage.backward(f"m{i}", torch.randn(2, 12, 32))
        assert not any(p.grad.any() for p in stage.params)  # moved into the exact sum
    contribution = stage.grad_contribution("r")
    assert contribution.count == 3 and contribution.grad_sum.dtype == torch.int64 and contribution.grad_sum.any()
    mean, count = stage.reduce([contribution])
    stage.apply_mean(mean, count, total_sq_norm=stage.grad_sq_norm(mean))
    assert all(p.grad is not None and not p.grad.any() for p in stage.params)
    assert not stage.grad_contribution("r").grad_sum.any()


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


def test_a_contribution_counts_only_the_data_holders_the_iteration_kept():
    """The race of a data holder dying mid-iteration (stop 26's CI: stages 1 and 2 counted 5 microbatches, the
    data holders 4): the dead holder's microbatch finished its backward here before its death was known. With
    the data holders' members named (``count_only``), the contribution holds the live holder's microbatches
    only, bitwise as a replica that never saw the other's; with every holder named (or none said), all of them,
    bitwise as one sum of all. Nothing is left for the next iteration."""
    spec, _, parts = _parts()
    raced, clean, whole = (StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1) for _ in range(3))
    x = {mb: torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(k)) for k, mb in enumerate("abcd")}
    g = {mb: torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(10 + k)) for k, mb in enumerate("abcd")}
    holder = {"a": "dh0", "b": "dh1", "c": "dh0", "d": "dh1"}  # dh1 dies after its b and d came back here
    for mb in "abcd":
        raced.forward(mb, x[mb])
        raced.backward(mb, g[mb], holder[mb])
        whole.forward(mb, x[mb])
        whole.backward(mb, g[mb])
        if holder[mb] == "dh0":
            clean.forward(mb, x[mb])
            clean.backward(mb, g[mb], "dh0")
    everything = raced.grad_contribution("r")
    expected = whole.grad_contribution("r")
    assert everything.count == 4 and torch.equal(everything.grad_sum, expected.grad_sum)
    assert everything.bound == expected.bound
    raced.count_only(("dh0", "dh1"))
    assert torch.equal(raced.grad_contribution("r").grad_sum, expected.grad_sum)
    raced.count_only(("dh0",))
    ours, theirs = raced.grad_contribution("r"), clean.grad_contribution("r")
    assert (ours.count, raced.counted(), raced.count) == (2, 2, 4)
    assert torch.equal(ours.grad_sum, theirs.grad_sum) and ours.bound == theirs.bound
    raced.count_only(())
    assert raced.grad_contribution("r").count == 0 and not raced.grad_contribution("r").grad_sum.any()
    raced.discard_gradients()
    raced.forward("e", x["a"])
    raced.backward("e", g["a"], "dh1")  # a new iteration: every holder counts again, nothing of the last is left
    later = raced.grad_contribution("r")
    clean.discard_gradients()
    clean.forward("e", x["a"])
    clean.backward("e", g["a"], "dh0")
    assert later.count == 1 and torch.equal(later.grad_sum, clean.grad_contribution("r").grad_sum)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_redo_recomputes_a_lost_replicas_contribution_bitwise(dropout):
    """Replica "lost" did microbatches a and b and died with its sum; a survivor that did c redoes a and b from
    the inputs and output gradients "lost" got: the same bits as the lost sum (dropout seeded per microbatch),
    and its own sum, count and forward states untouched."""
    spec, _, parts = _parts(dropout=dropout)
    lost, survivor = (StageExecutor(copy.deepcopy(parts.stages[0]), spec, 1) for _ in range(2))
    inputs = {mb: torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(k)) for k, mb in enumerate("abc")}
    grads = {mb: torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(10 + k)) for k, mb in enumerate("abc")}
    sent_back = {}
    for mb in "ab":
        output = lost.forward(mb, inputs[mb])
        assert torch.equal(survivor.recompute(mb, inputs[mb]), output)  # what it sent on, redone
        sent_back[mb] = lost.backward(mb, grads[mb])
    survivor.forward("c", inputs["c"])
    survivor.forward("d", inputs["a"])  # pending: its state survives the redo
    survivor.backward("c", grads["c"])
    own = survivor.grad_contribution("s")
    redone, grads_in = survivor.redo("lost", [(mb, inputs[mb], grads[mb]) for mb in "ba"])
    assert grads_in.keys() == sent_back.keys() and all(torch.equal(grads_in[k], sent_back[k]) for k in "ab")
    expected = lost.grad_contribution("lost")
    assert torch.equal(redone.grad_sum, expected.grad_sum) and (redone.count, redone.bound) == (2, expected.bound)
    after = survivor.grad_contribution("s")
    assert torch.equal(after.grad_sum, own.grad_sum) and after.count == 1 and survivor.status("d") == "pending"
    with pytest.raises(ValueError, match="redo gradient"):
        survivor.redo("lost", [("a", inputs["a"], torch.zeros(2, 11, 32))])
    assert torch.equal(survivor.grad_contribution("s").grad_sum, own.grad_sum)
