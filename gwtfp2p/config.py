"""Configuration shared by every layer: the run spec and the flow protocol's parameters, validated.

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
    advert_period_ticks: int = 1
    """Least gap between two adverts a node sends (keep-alive: every 4 periods). Growth and cost
    improvements travel one hop per period: 1 (every tick) converged a in 203 ticks instead of 278
    with 2, at +13 % messages on a settled ``tight`` swarm (docs/flow-tight.md, "Adopted: adverts every tick")."""
    residual_period_ticks: int = 2
    """Least gap between two residual-label messages a node sends (blocked flags, want notices;
    keep-alive: every 4 periods). Augmenting walks and the lifetimes of flags and notices scale with it."""
    refresh_period_ticks: int = 3
    table_period_ticks: int = 3
    soft_state_ttl_ticks: int = 16
    outstanding_ttl_ticks: int = 12
    proposal_timeout_ticks: int = 8
    request_batch: int = 4
    improve_probability: float = 0.5
    temperature_relay: float = 0.01
    cooling: float = 0.95
    reheat_factor: float = 4.0
    min_temperature: float = 1e-4
    max_path_weight: float = 0.5
    reroute_margin: float = 0.2
    """Relative saving (of the unit's remaining path cost) that starts a make-before-break re-route; 0
    disables re-routes. Hysteresis: a saving smaller than the spread of measured costs is no real gain."""
    reject_backoff_ticks: int = 3
    gain_epsilon: float = 0.05
    """Hysteresis of the annealer: a move is taken only when it gains more than this × the node's mean
    edge cost (and a worse one is drawn only when it loses more than that). Smaller gains are below
    what measured costs can tell apart, and each move breaks a chain for a tick or two."""
    augment: bool = True
    """Augmenting steps (flow/augment.py): a data holder that cannot grow has units moved along its
    residual labels until it can. False keeps the labels but takes no step, and holds no cost-driven
    move for it (the protocol before issue 15's augmenting paths)."""
    deep_cross: bool = True
    """Cross-holder augmenting steps chain (flow/residual.py, flow/augment.py): another holder's unit may be
    displaced when that holder can re-route it by a walk that itself displaces units of further holders.
    False: only when that holder can re-route it by moving its own units (one level)."""
    loop_free_labels: bool = True
    """Residual labels travel with their paths (flow/ways.py): no node takes a way through itself, so
    labels never count up along the residual graph's cycles after the way they stood for has gone. On
    since stop 58, with ``takeover_steps`` (docs/flow-tight.md, "Adopted: loop-free labels and takeover
    steps"); False: hop counts only (labels may count up to the hop limit)."""
    takeover_steps: bool = True
    """A full relay on an augmenting walk may have a same-stage peer with spare capacity take one of its units
    over (the unit keeps its previous and next hop), freeing the slot for the blocked holder
    (flow/ways.py ``takeover_offer``, flow/augment.py). On since stop 58, with ``loop_free_labels``."""
    walk_settle_ticks: int = 0
    """A data holder walks only once its own walk label has kept its value this many ticks: a label that
    counts up along the residual graph's cycles, after the way it stood for has gone, changes every few
    ticks and never settles. 0: at once, whenever the label is finite. Measured and held back
    (docs/flow-tight.md, "a settled label")."""
    flag_settle_ticks: int = 0
    """A data holder flags itself blocked (nodes that see the flag hold their cost-driven moves) only once
    its own walk label has kept its value this many ticks. 0: at once, whenever the label is finite.
    Measured and held back: ``b`` converges in 210 ticks instead of 288, ``tight`` reaches its maximum on
    39 of 50 swarms instead of 45 (docs/flow-tight.md, "a settled label")."""
    swaps_under_flags: bool = True
    """While a blocked holder's flag holds cost-driven moves (``NodeCore.flow_first``), relays still swap the
    next hops of two units and exchange whole units (flow/annealing.py): those moves keep every node's load,
    so they cannot take the capacity an augmenting step frees; takeovers and re-routes stay held. False holds
    them all (before stop 56: ``b`` converged in 290 ticks instead of 222, docs/flow-tight.md)."""
    fair_share: bool = True
    """Fairness between data holders (flow/fairness.py, max-min): a holder that routes more than one that
    wants more and cannot grow holds its growth back, and gives up one unit when it routes two more; it
    takes its growth up again when the poorer holder did not gain within ``fair_patience_ticks``."""
    fair_patience_ticks: int = 120
    """How long a holder holds back (after giving up a unit, or for a poorer holder's count) before it
    grows again when the poorer holder did not gain."""
    iteration_budget_s: float = 0.0
    """Seconds one iteration may take. With it, a node carries at most as many units as its GPU
    (``compute_s_per_unit``) and its uplink (``uplink_s_per_unit``) serve in that time, besides
    what fits in memory; 0 leaves memory (and a holder's supply) as the only bound."""

    def __post_init__(self) -> None:
        require_positive(self.tick_s, "--flow-tick-s")
        require(isinstance(self.iteration_budget_s, (int, float)) and math.isfinite(self.iteration_budget_s)
                and self.iteration_budget_s >= 0, "--flow-iteration-budget-s",
                f"must be a finite number of seconds >= 0 (0: memory alone bounds), got {self.iteration_budget_s!r}")
        for name in ("advert_period_ticks", "residual_period_ticks", "refresh_period_ticks", "table_period_ticks",
                     "soft_state_ttl_ticks", "outstanding_ttl_ticks", "proposal_timeout_ticks",
                     "request_batch", "reject_backoff_ticks", "fair_patience_ticks"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"--flow-{name.replace('_', '-')}",
                    f"must be an integer >= 1, got {value!r}")
        require(self.soft_state_ttl_ticks > 2 * self.refresh_period_ticks, "--flow-soft-state-ttl-ticks",
                "must exceed twice --flow-refresh-period-ticks, or live units expire between refreshes")
        for name in ("walk_settle_ticks", "flag_settle_ticks"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, f"--flow-{name.replace('_', '-')}",
                    f"must be an integer >= 0 (0: at once), got {value!r}")
        require(isinstance(self.augment, bool), "--flow-augment", f"must be true or false, got {self.augment!r}")
        require(isinstance(self.swaps_under_flags, bool), "--flow-swaps-under-flags",
                f"must be true or false, got {self.swaps_under_flags!r}")
        require(isinstance(self.fair_share, bool), "--flow-fair-share",
                f"must be true or false, got {self.fair_share!r}")
        require_probability(self.improve_probability, "--flow-improve-probability")
        require_probability(self.cooling, "--flow-cooling")
        require_positive(self.temperature_relay, "--flow-temperature-relay")
        require(self.reheat_factor >= 1.0, "--flow-reheat-factor", "must be >= 1 (1 disables reheating)")
        require(self.max_path_weight >= 0.0, "--flow-max-path-weight", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class CostSettling:
    """How a node's measured edge costs reach its flow (``gwtfp2p.flow.costs.SettledCosts``).

    A measured cost carries noise (on a loaded 2-core machine the smoothed cost of one link spans
    about ±25 % between its 10th and 90th percentiles), and every cost the flow sees change can move
    units. The flow keeps a cost until the smoothed measurement has stayed past the tolerance on the
    same side for ``confirmations`` probes in a row; then it takes the smoothed value.
    """

    smoothing: float = 0.1
    """Weight of a new measurement in the moving average the tolerance is judged on (0 < a <= 1)."""
    rel_tolerance: float = 0.4
    """Relative change of the smoothed cost, against the cost the flow holds, that counts as real."""
    abs_tolerance_s: float = 2e-3
    """Changes of at most this many seconds never count (loopback and LAN links cost a few ms)."""
    confirmations: int = 3
    """Probes in a row that must see the change (on the same side) before the flow takes it."""

    def __post_init__(self) -> None:
        require(isinstance(self.smoothing, (int, float)) and 0.0 < self.smoothing <= 1.0, "CostSettling.smoothing",
                f"must be within (0, 1], got {self.smoothing!r}")
        require(isinstance(self.rel_tolerance, (int, float)) and 0.0 <= self.rel_tolerance < 10.0,
                "CostSettling.rel_tolerance", f"must be within [0, 10), got {self.rel_tolerance!r}")
        require(isinstance(self.abs_tolerance_s, (int, float)) and 0.0 <= self.abs_tolerance_s < 60.0,
                "CostSettling.abs_tolerance_s", f"must be within [0, 60) seconds, got {self.abs_tolerance_s!r}")
        require(isinstance(self.confirmations, int) and self.confirmations >= 1, "CostSettling.confirmations",
                f"must be an integer >= 1, got {self.confirmations!r}")


MODEL_FAMILIES = ("gpt2", "llama")
CLIP_MODES = ("global", "per_part")
WIRE_CODECS = ("none", "float16", "bfloat16", "blockwise8")
"""How tensors travel between nodes (``gwtfp2p.transport.compression`` encodes them): ``none`` as they
are; ``float16`` with one power-of-two scale per tensor; ``bfloat16``; ``blockwise8``: int8 values with
one bfloat16 scale per block of ``BLOCKWISE8_BLOCK_VALUES`` values (absmax)."""
BLOCKWISE8_BLOCK_VALUES = 64
FLOAT16_HEADER_BYTES = 4  # the tensor's power-of-two scale (int32) precedes its float16 values


def encoded_bytes(codec: str, numel: int, native_bytes: int) -> int:
    """Bytes of ``numel`` values of ``native_bytes`` each on the wire under ``codec`` (exact, no framing)."""
    if codec == "none":
        return numel * native_bytes
    if codec == "float16":
        return FLOAT16_HEADER_BYTES + 2 * numel
    if codec == "bfloat16":
        return 2 * numel
    if codec == "blockwise8":
        return numel + 2 * -(-numel // BLOCKWISE8_BLOCK_VALUES)
    raise ConfigError(f"--codec: unknown wire codec {codec!r}; choose one of {', '.join(WIRE_CODECS)}")


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
    clip_mode: str = "global"
    """How ``grad_clip`` bounds the step. ``"global"``: one L2 norm over the whole model's mean
    gradient (every part's squared norm reaches every part before it steps), as a single process
    clips. ``"per_part"``: each part (the data holders' head+tail, each stage) is clipped by its own
    norm, a different training whenever clipping triggers."""
    forward_codec: str = "none"
    """How activations travel to the next hop (one of ``WIRE_CODECS``; docs/transport.md). Lossy codecs
    are deterministic: a resent output is the same bytes, so recovery still redoes at most one hop."""
    backward_codec: str = "none"
    """How gradients of activations travel back to the previous hop (one of ``WIRE_CODECS``)."""
    aggregate_codec: str = "none"
    """How a replica's gradient sum travels to its part's other replicas (one of ``WIRE_CODECS``).
    ``none``: the exact int64 fixed-point sum (the swarm steps exactly as one process). A lossy codec
    rounds each replica's sum once; every replica, the sender included, steps on the sums decoded from
    the same bytes, so replicas stay bit-identical, but the step then depends on how the microbatches
    were split over replicas."""
    screen_factor: float = 64.0
    """Robust aggregation (docs/security.md): a contribution whose gradient norm per microbatch**0.75 is
    over this many times the replicas' (lower) median is left out of the step, and with three or more
    contributions one whose mean gradient points away from the replicas' median too. Honest replicas
    were measured up to 16.5x apart, but an honest gradient spike can exceed any bound (the demo's
    iteration 24: one microbatch 350x the others'): then the step is not the single process's. ``0``
    turns the screen off: every valid agreed contribution is used (exact, for trusted members only)."""

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
        require(self.clip_mode in CLIP_MODES, "--clip-mode",
                f"must be one of {', '.join(CLIP_MODES)} (global: as a single process clips), got {self.clip_mode!r}")
        require(self.screen_factor == 0 or self.screen_factor >= 1, "--screen-factor",
                f"must be 0 (no screen) or >= 1, got {self.screen_factor!r}")
        for flag, codec in (("--forward-codec", self.forward_codec), ("--backward-codec", self.backward_codec),
                            ("--aggregate-codec", self.aggregate_codec)):
            require(codec in WIRE_CODECS, flag, f"must be one of {', '.join(WIRE_CODECS)}, got {codec!r}")
