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
    reroute_margin: float = 0.1
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


NODE_ROLES = ("data", "relay")
DEVICE_PATTERN = ("cpu", "cuda", "auto")


@dataclass(frozen=True)
class NodeConfig:
    """How one daemon (``gwtf join``) runs: its role, stage, network, device and pacing.

    ``stage`` is None for ``--stage auto`` (a relay picks its stage from the swarm's flow);
    a data holder always serves stage 0. ``port`` 0 picks a free port. ``capacity`` is the
    microbatches per iteration a relay can hold (0: the default of 16). ``shard``/``n_shards``
    name a data holder's slice of the data. ``run_spec_path`` is read by the first data holder
    of a run (empty: the embedded demo spec). A data holder starts its first iteration once the
    run has ``min_nodes`` online nodes (itself included). ``checkpoint_dir`` (empty: none) holds
    this node's local checkpoint of its stage, written every ``checkpoint_every`` steps and restored
    when it joins a stage that has no live replica. ``replay_steps`` last steps (mean gradients) are
    kept for joiners whose downloaded state fell behind. Times are seconds.
    """

    role: str = "relay"
    stage: int | None = None
    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    announce_maddrs: tuple[str, ...] = ()
    device: str = "cpu"
    capacity: int = 0
    identity_path: str = ""
    run_spec_path: str = ""
    location: str = ""
    location_scale: float = 1.0
    tick_s: float = 1.0
    heartbeat_s: float = 5.0
    shard: int = 0
    n_shards: int = 1
    max_iterations: int = 0
    min_nodes: int = 0
    torch_threads: int = 1
    grace_s: float = 10.0
    default_bandwidth_bytes_per_s: float = 1e9
    startup_timeout_s: float = 60.0
    checkpoint_dir: str = ""
    checkpoint_every: int = 10
    replay_steps: int = 4

    def __post_init__(self) -> None:
        require(self.role in NODE_ROLES, "--role", f"must be one of {', '.join(NODE_ROLES)}, got {self.role!r}")
        if self.role == "data":
            require(self.stage in (None, 0), "--stage", "a data holder serves stage 0; drop --stage or use 0")
        else:
            require(self.stage is None or (isinstance(self.stage, int) and self.stage >= 1), "--stage",
                    f"a relay serves a stage >= 1 (or 'auto'), got {self.stage!r}")
        require(self.is_data_holder or bool(self.initial_peers), "--initial-peers",
                "a relay joins a running swarm: give the address a running node printed (/ip4/.../p2p/...)")
        require(all(isinstance(p, str) and p.startswith("/") for p in self.initial_peers), "--initial-peers",
                "each peer is a multiaddr such as /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...")
        require(bool(self.host) and " " not in self.host, "--host", "give an IPv4 address such as 0.0.0.0")
        require(isinstance(self.port, int) and 0 <= self.port <= 65535, "--port",
                f"must be within 0..65535 (0 picks a free port), got {self.port!r}")
        require(all(isinstance(a, str) and a.startswith("/") for a in self.announce_maddrs), "--announce",
                "each address is a multiaddr such as /ip4/203.0.113.7/tcp/31337")
        require(self.device in DEVICE_PATTERN or self.device.startswith("cuda:"), "--device",
                f"use cpu, cuda, cuda:N or auto, got {self.device!r}")
        require(isinstance(self.capacity, int) and self.capacity >= 0, "--capacity",
                f"must be an integer >= 0 (0: default), got {self.capacity!r}")
        require(self.location_scale >= 0 and math.isfinite(self.location_scale), "--link-scale",
                "must be a finite number >= 0 (0 disables the emulated delay)")
        require_positive(self.tick_s, "--tick-s")
        require_positive(self.heartbeat_s, "--heartbeat-s")
        require(isinstance(self.n_shards, int) and self.n_shards >= 1, "--shard",
                "the shard count must be >= 1, as in --shard 0/2")
        require(isinstance(self.shard, int) and 0 <= self.shard < self.n_shards, "--shard",
                f"the shard index must be within 0..{self.n_shards - 1}, as in --shard 1/{self.n_shards}")
        require(isinstance(self.max_iterations, int) and self.max_iterations >= 0, "--max-iterations",
                "must be an integer >= 0 (0: train until stopped)")
        require(isinstance(self.min_nodes, int) and self.min_nodes >= 0, "--min-nodes",
                "must be an integer >= 0 (0: start as soon as a route exists)")
        require(self.min_nodes == 0 or self.is_data_holder, "--min-nodes", "only a data holder waits for nodes")
        require(isinstance(self.torch_threads, int) and self.torch_threads >= 0, "--torch-threads",
                "must be an integer >= 0 (0: torch's default)")
        require(self.grace_s >= 0, "--grace-s", "must be >= 0")
        require_positive(self.default_bandwidth_bytes_per_s, "--bandwidth")
        require_positive(self.startup_timeout_s, "--startup-timeout-s")
        require(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1, "--checkpoint-every",
                f"must be an integer >= 1 (steps between checkpoints), got {self.checkpoint_every!r}")
        require(isinstance(self.replay_steps, int) and self.replay_steps >= 0, "--replay-steps",
                f"must be an integer >= 0 (steps kept for joiners to replay; 0: none), got {self.replay_steps!r}")
        require(not self.checkpoint_dir or "\0" not in self.checkpoint_dir, "--checkpoint-dir",
                "give a directory path (it is created if missing)")

    @property
    def is_data_holder(self) -> bool:
        return self.role == "data"

    @property
    def host_maddrs(self) -> tuple[str, ...]:
        return (f"/ip4/{self.host}/tcp/{self.port}",)

    @property
    def relay_capacity(self) -> int:
        return self.capacity or 16
