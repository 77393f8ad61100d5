"""Configuration: frozen, validated dataclasses for the flow protocol's parameters.

Every configuration object is built once, validated in ``__post_init__`` and never mutated.
Errors are ``ConfigError`` and name the offending flag and how to fix it. This module owns no
I/O and imports nothing from the rest of the package (it is the bottom layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag and the fix."""


def require(condition: bool, flag: str, message: str) -> None:
    """Raise ``ConfigError`` naming ``flag`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{flag}: {message}")


def require_positive(value: float, flag: str) -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, flag,
            f"must be a positive finite number, got {value!r}")


def require_probability(value: float, flag: str) -> None:
    require(isinstance(value, (int, float)) and 0.0 <= value <= 1.0, flag,
            f"must be within [0, 1], got {value!r}")


@dataclass(frozen=True)
class FlowParams:
    """Parameters of the decentralized flow protocol (see docs/flow.md for their meaning).

    Time is counted in protocol ticks; the daemon maps one tick to ``tick_s`` seconds.
    """

    tick_s: float = 1.0
    advert_period_ticks: int = 2
    refresh_period_ticks: int = 3
    table_period_ticks: int = 3
    soft_state_ttl_ticks: int = 12
    outstanding_ttl_ticks: int = 8
    proposal_timeout_ticks: int = 4
    request_batch: int = 4
    improve_probability: float = 0.5
    temperature_relay: float = 0.01
    cooling: float = 0.95
    reheat_factor: float = 4.0
    min_temperature: float = 1e-4
    max_path_weight: float = 0.5
    reject_backoff_ticks: int = 3
    gain_epsilon: float = 1e-3

    def __post_init__(self) -> None:
        require_positive(self.tick_s, "--flow-tick-s")
        for name in ("advert_period_ticks", "refresh_period_ticks", "table_period_ticks",
                     "soft_state_ttl_ticks", "outstanding_ttl_ticks", "proposal_timeout_ticks",
                     "request_batch", "reject_backoff_ticks"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"--flow-{name.replace('_', '-')}",
                    f"must be an integer >= 1, got {value!r}")
        require(self.soft_state_ttl_ticks > 2 * self.refresh_period_ticks, "--flow-soft-state-ttl-ticks",
                "must exceed twice --flow-refresh-period-ticks, or live units expire between refreshes")
        require_probability(self.improve_probability, "--flow-improve-probability")
        require_probability(self.cooling, "--flow-cooling")
        require_positive(self.temperature_relay, "--flow-temperature-relay")
        require(self.reheat_factor >= 1.0, "--flow-reheat-factor", "must be >= 1 (1 disables reheating)")
        require(self.max_path_weight >= 0.0, "--flow-max-path-weight", "must be >= 0")


MODEL_FAMILIES = ("gpt2", "llama")


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one training run; a run is named by the hash of this spec.

    ``partition`` optionally gives the number of decoder layers of each relay stage explicitly;
    empty means a balanced split of the preset's layers over ``n_stages``. ``vocab_size`` is the
    model's vocabulary (every node needs it to build the same initial weights, even those without
    the tokenizer); 0 means the byte tokenizer's 257.
    """

    model_family: str = "gpt2"
    model_preset: str = "tiny"
    n_stages: int = 2
    partition: tuple[int, ...] = ()
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    microbatch_size: int = 2
    seq_len: int = 32
    microbatches_per_dh: int = 4
    dataset: str = ""
    tokenizer: str = "bytes"
    vocab_size: int = 0

    def __post_init__(self) -> None:
        require(self.model_family in MODEL_FAMILIES, "--model-family",
                f"must be one of {', '.join(MODEL_FAMILIES)}, got {self.model_family!r}")
        require(bool(self.model_preset), "--model-preset", "must name a preset (e.g. tiny)")
        require(isinstance(self.n_stages, int) and self.n_stages >= 1, "--stages",
                f"must be an integer >= 1, got {self.n_stages!r}")
        if self.partition:
            require(len(self.partition) == self.n_stages, "--partition",
                    f"needs one layer count per stage ({self.n_stages}), got {len(self.partition)}")
            require(all(isinstance(n, int) and n >= 1 for n in self.partition), "--partition",
                    "every stage needs at least one layer")
        require_positive(self.lr, "--lr")
        require(self.weight_decay >= 0, "--weight-decay", "must be >= 0")
        require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "--betas", "must be within [0, 1)")
        require_positive(self.adam_eps, "--adam-eps")
        require_positive(self.grad_clip, "--grad-clip")
        for flag, value in (("--microbatch-size", self.microbatch_size), ("--seq-len", self.seq_len),
                            ("--microbatches-per-dh", self.microbatches_per_dh)):
            require(isinstance(value, int) and value >= 1, flag, f"must be an integer >= 1, got {value!r}")
        require(self.tokenizer == "bytes" or bool(self.tokenizer), "--tokenizer",
                "use 'bytes' or a local transformers tokenizer path")
        require(isinstance(self.vocab_size, int) and self.vocab_size >= 0, "--vocab-size",
                f"must be an integer >= 0 (0: the byte tokenizer's 257), got {self.vocab_size!r}")
        require(self.tokenizer == "bytes" or self.vocab_size > 0, "--vocab-size",
                "is required with a transformers tokenizer (set it to the tokenizer's length)")
        require(self.tokenizer != "bytes" or self.vocab_size == 0 or self.vocab_size >= 257,
                "--vocab-size", f"must be 0 or >= 257 with the byte tokenizer, got {self.vocab_size}")
