"""The in-process pipeline against a single process written on plain transformers classes.

200 iterations of gpt2-tiny and llama-tiny on the embedded corpus (2 data holders x 2
microbatches of 2 x 16 tokens, 2 stages, 2 replicas of stage 1), lr 3e-3 as in the demo, with a
clip threshold at which about half of the iterations clip. The plain trainer implements the
arithmetic docs/model.md specifies from scratch (``plain_reference.py``); the harness must give
the same losses. Per-part clipping, a different training, must be caught by the same comparison,
and a conventional float32 loop must stay close where training is stable.
"""

from __future__ import annotations

import functools

import pytest
import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.corpus import default_corpus
from gwtfp2p.model.data import MicrobatchSampler
from gwtfp2p.model.harness import PipelineHarness, microbatch_id
from gwtfp2p.model.tokenizer import ByteTokenizer
from tests.unit.model.plain_reference import PlainTrainer, plain_model

TOLERANCE = 1e-6
DATA_HOLDERS, PER_DH = 2, 2


@functools.lru_cache(maxsize=1)
def _stream() -> torch.Tensor:
    """The first 300 documents of the embedded corpus, byte-tokenized (~77k tokens)."""
    tok = ByteTokenizer()
    return torch.tensor([i for doc in default_corpus()[:300] for i in [*tok.encode(doc), tok.eos_id]],
                        dtype=torch.int32)


def _spec(family: str, *, lr: float = 3e-3, clip_mode: str = "global") -> RunSpec:
    return RunSpec(model_family=family, model_preset="tiny", n_stages=2, seed=3, lr=lr, grad_clip=1.0,
                   microbatch_size=2, seq_len=16, microbatches_per_dh=PER_DH, clip_mode=clip_mode)


def _compare(family: str, iterations: int, *, spec: RunSpec, gradient: str = "exact") -> tuple[float, int, float]:
    """(max |Δloss| over all microbatches and iterations, iterations the plain trainer clipped, last mean loss)."""
    harness = PipelineHarness(spec, ByteTokenizer.vocab_size, replicas=[2, 1], data_holders=DATA_HOLDERS)
    plain = PlainTrainer(plain_model(family, ByteTokenizer.vocab_size, spec.seed), lr=spec.lr,
                         betas=(spec.beta1, spec.beta2), eps=spec.adam_eps, weight_decay=spec.weight_decay,
                         max_norm=spec.grad_clip, gradient=gradient)
    samplers = [MicrobatchSampler(_stream(), seq_len=spec.seq_len, microbatch_size=spec.microbatch_size,
                                  seed=spec.seed, shard=d, n_shards=DATA_HOLDERS) for d in range(DATA_HOLDERS)]
    worst, last = 0.0, 0.0
    for it in range(iterations):
        batches = {d: s.iteration(it, PER_DH) for d, s in enumerate(samplers)}
        result = harness.run_iteration(it, batches, order_seed=it)
        ours = [result.losses[microbatch_id(d, it, i)] for d in range(DATA_HOLDERS) for i in range(PER_DH)]
        theirs = plain.step([x for d in range(DATA_HOLDERS) for x in batches[d]])
        worst = max(worst, *(abs(a - b) for a, b in zip(ours, theirs, strict=True)))
        last = result.mean_loss
    return worst, plain.clipped, last


def test_the_plain_models_start_from_the_runs_initial_weights():
    for family in ("gpt2", "llama"):
        harness = PipelineHarness(_spec(family), ByteTokenizer.vocab_size)
        plain = plain_model(family, ByteTokenizer.vocab_size, seed=3)
        ours = [p for group in harness.part_parameters() for p in group]
        assert sorted(map(tuple, (p.shape for p in ours))) == sorted(map(tuple, (p.shape for p in plain.parameters())))
        plain_by_bytes = {p.detach().numpy().tobytes() for p in plain.parameters()}
        assert all(p.detach().numpy().tobytes() in plain_by_bytes for p in ours)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_two_hundred_globally_clipped_iterations_match_a_plain_single_process(family):
    worst, clipped, last = _compare(family, 200, spec=_spec(family))
    assert 50 <= clipped <= 150, clipped  # clipping is active in many iterations, not all
    assert last < 3.5  # it learns (from ~5.55)
    assert worst <= TOLERANCE, worst


@pytest.mark.timeout(120)
def test_per_part_clipping_is_caught_by_the_same_comparison():
    worst, clipped, _ = _compare("gpt2", 60, spec=_spec("gpt2", clip_mode="per_part"))
    assert clipped > 0 and worst > 1e-4, worst


@pytest.mark.timeout(120)
def test_a_conventional_float32_loop_stays_close_where_training_is_stable():
    """float32 accumulation in microbatch order and clip_grad_norm_ round differently from the
    exact sums (the first differences appear within a few iterations); at lr 3e-4 they stay at a
    few float32 ulps of the loss instead of being amplified."""
    worst, clipped, _ = _compare("gpt2", 100, spec=_spec("gpt2", lr=3e-4), gradient="conventional")
    assert clipped > 0 and worst <= 1e-5, worst
