"""Pipeline training (harness) against single-process training of the unsplit model: the same bits.

The reference trainer uses the swarm's documented arithmetic (exact per-microbatch sums, global
or per-part clipping), so the harness must match it exactly, whatever the routes, the hop order,
the number of replicas, the arrival order of contributions or recomputed hops.
"""

from __future__ import annotations

import math

import pytest

from gwtfp2p.model.harness import PipelineHarness, microbatch_id
from gwtfp2p.model.reference import ReferenceTrainer
from tests.unit.model.tiny import VOCAB, random_batches, tiny_spec


def _pipeline_losses(result, batches, it) -> list[float]:
    return [result.losses[microbatch_id(d, it, i)] for d in sorted(batches) for i in range(len(batches[d]))]


def _train_both(spec, *, replicas, iterations, per_dh=(2, 1), resends=None):
    harness = PipelineHarness(spec, VOCAB, replicas=replicas, data_holders=len(per_dh))
    reference = ReferenceTrainer(spec, VOCAB)
    mismatches, results = 0, []
    for it in range(iterations):
        batches = random_batches(per_dh, seed=1000 + it, spec=spec)
        result = harness.run_iteration(it, batches, order_seed=it, resends=(resends or {}).get(it))
        ref_losses = reference.step([x for d in sorted(batches) for x in batches[d]])
        mismatches += sum(a != b for a, b in zip(ref_losses, _pipeline_losses(result, batches, it), strict=True))
        assert result.replicas_in_sync(), f"replicas differ after iteration {it}"
        results.append(result)
    return harness, reference, results, mismatches


def _params_equal(harness, reference) -> bool:
    pairs = zip(harness.part_parameters(), reference.groups, strict=True)
    return all(a.equal(b) for ga, gb in pairs for a, b in zip(ga, gb, strict=True))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("n_stages", [1, 2, 4])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_twenty_globally_clipped_iterations_equal_unsplit_training_bitwise(family, n_stages, replicas):
    spec = tiny_spec(family, n_stages, grad_clip=0.5)
    harness, reference, results, mismatches = _train_both(spec, replicas=replicas, iterations=20)
    assert mismatches == 0 and _params_equal(harness, reference)
    clipped = sum(r.data_holder_steps[0].clipped for r in results)
    assert clipped >= 10 and all(s.clip_norm == math.sqrt(r.total_sq_norm) for r in results
                                            for s in r.data_holder_steps)
    assert results[-1].mean_loss < results[0].mean_loss + 0.5  # random tokens: trains without blowing up


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_per_part_clipping_equals_the_per_part_reference_bitwise(family):
    spec = tiny_spec(family, 2, grad_clip=0.05, partition=(3, 1), clip_mode="per_part")
    harness, reference, results, mismatches = _train_both(spec, replicas=2, iterations=5)
    assert all(s.clipped for r in results for group in r.stage_steps for s in group)
    assert all(r.total_sq_norm is None for r in results)
    assert mismatches == 0 and _params_equal(harness, reference)


@pytest.mark.timeout(60)
def test_per_part_and_global_clipping_are_different_trainings():
    losses = {}
    for mode in ("global", "per_part"):
        spec = tiny_spec("gpt2", 2, grad_clip=0.05, clip_mode=mode)
        harness = PipelineHarness(spec, VOCAB)
        losses[mode] = [harness.run_iteration(it, random_batches([2], seed=it, spec=spec)).mean_loss
                        for it in range(4)]
    assert losses["global"][0] == losses["per_part"][0]  # the same weights until the first step
    assert max(abs(a - b) for a, b in zip(losses["global"], losses["per_part"], strict=True)) > 1e-4


def _losses_and_hashes(family, replicas, *, order_seed, resends=None, iterations=8):
    spec = tiny_spec(family, 3, grad_clip=0.3, microbatch_size=1)
    harness = PipelineHarness(spec, VOCAB, replicas=replicas, data_holders=2)
    losses = []
    for it in range(iterations):
        batches = random_batches([3, 2], seed=it, spec=spec)
        result = harness.run_iteration(it, batches, order_seed=order_seed + it, resends=(resends or {}).get(it))
        assert all(result.recompute_bitwise_equal) and result.replicas_in_sync()
        losses.append(_pipeline_losses(result, batches, it))
    hashes = [harness.data_holders[0].state_hash()] + [group[0].state_hash() for group in harness.stages]
    return losses, hashes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_losses_are_bitwise_the_same_for_any_replicas_order_or_recompute(family):
    """1 vs 3 replicas per stage, other routes, hop orders and contribution arrival orders, and
    recomputed hops: the same losses and the same final states, to the bit."""
    baseline = _losses_and_hashes(family, 1, order_seed=0)
    assert _losses_and_hashes(family, 3, order_seed=0) == baseline
    assert _losses_and_hashes(family, [2, 3, 1], order_seed=100) == baseline
    resends = {1: {microbatch_id(0, 1, 0): (2, 2), microbatch_id(1, 1, 1): (1, 0)},
               5: {microbatch_id(0, 5, 2): (3, 0), microbatch_id(1, 5, 0): (1, 2)}}
    assert _losses_and_hashes(family, 3, order_seed=7, resends=resends) == baseline


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_resent_hops_recompute_bitwise_and_count_once(family):
    spec = tiny_spec(family, 3, microbatch_size=1)
    # iteration 1: microbatch 0 of data holder 0 loses its stage-2 hop and is recomputed on replica 2
    resends = {1: {microbatch_id(0, 1, 0): (2, 2), microbatch_id(1, 1, 1): (1, 0)}}
    harness, reference, results, mismatches = _train_both(spec, replicas=3, iterations=3, per_dh=(2, 2),
                                                          resends=resends)
    assert results[1].recompute_bitwise_equal == [True, True]
    assert all(step.count == 4 for group in results[1].stage_steps for step in group)
    assert mismatches == 0 and _params_equal(harness, reference)


@pytest.mark.timeout(60)
def test_replicas_join_and_leave_between_iterations_stay_in_sync():
    spec = tiny_spec("llama", 2)
    harness = PipelineHarness(spec, VOCAB, replicas=[2, 1], data_holders=1)
    reference = ReferenceTrainer(spec, VOCAB)
    for it in range(4):
        if it == 1:
            harness.add_replica(2)
        if it == 2:
            harness.remove_replica(1, 0)
        batches = random_batches([3], seed=it, spec=spec)
        result = harness.run_iteration(it, batches, order_seed=it)
        assert reference.step(batches[0]) == _pipeline_losses(result, batches, it)
        assert result.replicas_in_sync()
    assert _params_equal(harness, reference)
    assert len(harness.stages[1]) == 2 and len(harness.stages[0]) == 1


def test_tied_embedding_stays_one_parameter_after_training():
    spec = tiny_spec("gpt2", 1)
    harness = PipelineHarness(spec, VOCAB, data_holders=2)
    harness.run_iteration(0, random_batches([1, 1], seed=0, spec=spec))
    for dh in harness.data_holders:
        assert dh.module.head.tokens.weight is dh.module.tail.lm_head.weight
    a, b = harness.data_holders
    assert a.state_hash() == b.state_hash()
