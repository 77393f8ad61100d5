"""Build one node's replica of one part (a relay stage, or a data holder's head+tail) from a run spec.

Owns the rule that every node derives its part's initial weights the same way: build the whole
model from the run seed, split it, keep the part, drop the rest. (A joining node then replaces
them with a live replica's state bytes.) It does not move bytes or pick stages.
"""

from __future__ import annotations

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.partition import ModelParts, split_model


def build_parts(spec: RunSpec, vocab_size: int | None = None, *, dropout: float = 0.0) -> ModelParts:
    """The run's initial model, split as the spec says (head+tail and S stages).

    ``vocab_size`` defaults to the run's (see ``tokenizer.run_vocab_size``).
    """
    return split_model(build_from_spec(spec, vocab_size, dropout=dropout), spec.n_stages, spec.partition)


def make_stage_executor(spec: RunSpec, stage_index: int, vocab_size: int | None = None, *,
                        device: str = "cpu", dropout: float = 0.0) -> StageExecutor:
    """A replica of stage ``stage_index`` (1-based) with the run's initial weights, on ``device``."""
    if not 1 <= stage_index <= spec.n_stages:
        raise ValueError(f"stage {stage_index} is not within 1..{spec.n_stages}")
    module = build_parts(spec, vocab_size, dropout=dropout).stages[stage_index - 1]
    return StageExecutor(module.to(torch.device(device)), spec, stage_index)


def make_data_holder_executor(spec: RunSpec, vocab_size: int | None = None, *, device: str = "cpu",
                              dropout: float = 0.0) -> DataHolderExecutor:
    """A data holder's head+tail replica with the run's initial weights, on ``device``."""
    module = build_parts(spec, vocab_size, dropout=dropout).data_holder
    return DataHolderExecutor(module.to(torch.device(device)), spec)
