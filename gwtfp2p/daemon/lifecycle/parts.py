"""The model side of a node: its part (built on the compute thread), its data, a first
compute-time estimate.

The part is a relay stage's replica or a data holder's head+tail, with the run's seeded initial
weights; a data holder also loads its shard of the documents as a microbatch sampler.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.presets import get_preset
from gwtfp2p.model.replica import make_data_holder_executor, make_stage_executor
from gwtfp2p.model.tokenizer import run_vocab_size, tokenizer_for

if TYPE_CHECKING:
    from gwtfp2p.model.data import MicrobatchSampler

ESTIMATE_ROUNDS = 3
BACKWARD_FACTOR = 3.0  # forward + backward ≈ 3 × forward


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def build_part(spec: RunSpec, stage: int, device: str) -> StageExecutor | DataHolderExecutor:
    """This node's replica of its part with the run's seeded initial weights."""
    if stage == 0:
        return make_data_holder_executor(spec, device=resolve_device(device))
    return make_stage_executor(spec, stage, device=resolve_device(device))


def estimate_compute_s(part: StageExecutor | DataHolderExecutor, spec: RunSpec) -> float:
    """Seconds of forward + backward per microbatch, estimated from a few gradient-free forwards.

    Used until the first real microbatches are measured; nothing is kept or accumulated.
    """
    hidden = get_preset(spec.model_family, spec.model_preset).hidden
    shape = (spec.microbatch_size, spec.seq_len)
    device = next(part.module.parameters()).device
    with torch.no_grad():
        best = float("inf")
        for _ in range(ESTIMATE_ROUNDS):
            started = time.perf_counter()
            if isinstance(part, DataHolderExecutor):
                ids = torch.zeros(shape, dtype=torch.long, device=device)
                part.module.tail(part.module.head(ids), ids)
            else:
                part.module(torch.zeros((*shape, hidden), device=device))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - started)
    return BACKWARD_FACTOR * best


def load_sampler(spec: RunSpec, shard: int, n_shards: int) -> MicrobatchSampler:
    """The data holder's microbatch sampler (documents → tokens → its shard).

    ``datasets`` is imported here, not at module load: relays never pay its import time.
    """
    from gwtfp2p.model.data import load_documents, sampler_for, tokenize_documents

    tokens = tokenize_documents(load_documents(spec.dataset), tokenizer_for(spec))
    run_vocab_size(spec)
    return sampler_for(spec, tokens, shard, n_shards)
