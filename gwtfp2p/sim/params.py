"""Simulator configuration: frozen, validated dataclasses for the data plane, SWARM and a scenario.

Every value is checked once in ``__post_init__``; a ``ConfigError`` names the CLI flag and the fix.
Owns no behaviour: the engine, the routers and the scenarios read these objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gwtfp2p.config import ConfigError, FlowParams, require, require_positive
from gwtfp2p.sim.compute import get_model
from gwtfp2p.sim.network import NetworkSpec

CRASH_MODES = ("silent", "refused")
COMPUTE_KINDS = ("homogeneous", "heterogeneous")
ROUTERS = ("gwtf", "swarm", "oracle")


@dataclass(frozen=True)
class DataPlaneParams:
    """Failure detection and timeouts of the shared data plane (GWTF's side where they differ)."""

    crash_mode: str = "silent"  # silent: the machine vanishes; refused: the process dies, its host answers
    heartbeat_s: float = 2.0  # GWTF liveness records: refreshed every period, expire after two
    ack_timeout_factor: float = 3.0  # adaptive ack timeout = factor × (RTT + transfer), with a floor
    ack_timeout_floor_s: float = 0.5
    allreduce_failure_detect_s: float = 5.0  # a replica dying mid-all-reduce is noticed after this

    def __post_init__(self) -> None:
        require(self.crash_mode in CRASH_MODES, "--crash-mode", f"must be one of {', '.join(CRASH_MODES)}")
        require_positive(self.heartbeat_s, "--heartbeat-s")
        require(self.ack_timeout_factor >= 1.0, "--ack-timeout-factor", "must be >= 1 (1 = exactly RTT + transfer)")
        require(self.ack_timeout_floor_s >= 0, "--ack-timeout-floor-s", "must be >= 0")
        require(self.allreduce_failure_detect_s >= 0, "--allreduce-detect-s", "must be >= 0")

    def heartbeat_detect_s(self, u: float) -> float:
        """Record expiry after a crash: the last beat was u·period ago, the record lives two periods."""
        return self.heartbeat_s * (2.0 - u)


@dataclass(frozen=True)
class SwarmParams:
    """SWARM parallelism's released defaults (yandex-research/swarm, see docs/sim.md)."""

    forward_timeout_s: float = 30.0  # train_pipeline.py TIMEOUT
    backward_timeout_s: float = 75.0  # BACKWARD_TIMEOUT = TIMEOUT * 2.5
    backward_task_multiplier: float = 2.5  # BalancedRemoteExpert.backward_task_size_multiplier
    ema_alpha: float = 0.1  # PerformanceEMA
    initial_seconds_per_sample: float = 1.0  # ExpertBalancer.initial_throughput (used as s/sample)
    balancer_update_period_s: float = 30.0  # ExpertBalancer.update_period
    declare_period_s: float = 30.0  # Server.update_period: experts re-declared this often
    record_expiration_s: float = 300.0  # declare_experts(expiration=300)

    def __post_init__(self) -> None:
        for flag, value in (("--swarm-forward-timeout-s", self.forward_timeout_s),
                            ("--swarm-backward-timeout-s", self.backward_timeout_s),
                            ("--swarm-backward-multiplier", self.backward_task_multiplier),
                            ("--swarm-initial-s-per-sample", self.initial_seconds_per_sample),
                            ("--swarm-update-period-s", self.balancer_update_period_s),
                            ("--swarm-declare-period-s", self.declare_period_s),
                            ("--swarm-record-expiration-s", self.record_expiration_s)):
            require_positive(value, flag)
        require(0 < self.ema_alpha <= 1, "--swarm-ema-alpha", "must be within (0, 1]")
        require(self.record_expiration_s >= self.declare_period_s, "--swarm-record-expiration-s",
                "must be >= --swarm-declare-period-s or live experts vanish between declarations")


@dataclass(frozen=True)
class Scenario:
    """One named experiment: swarm shape, model, network, compute mix, churn and run length."""

    name: str
    description: str = ""
    model: str = "llama500m"
    n_stages: int = 6
    relays_per_stage: int = 8
    data_holders: int = 2
    microbatches_per_dh: int = 24
    network: NetworkSpec = field(default_factory=NetworkSpec)
    compute: str = "homogeneous"
    churn_pct_per_hour: float = 0.0
    join_pct_per_hour: float | None = None  # None: the same rate as the churn (a stable population)
    target_microbatches: int = 8000
    horizon_s: float = 4 * 3600.0
    min_replicas_after_crash: int = 2
    max_slots: int = 0  # cap on any node's memory slots (0: memory decides alone)
    flow_tick_s: float = 2.0
    dataplane: DataPlaneParams = field(default_factory=DataPlaneParams)
    swarm: SwarmParams = field(default_factory=SwarmParams)

    def __post_init__(self) -> None:
        require(bool(self.name), "--scenario", "needs a name")
        model = get_model(self.model)
        model.stage_layers(self.n_stages)
        for flag, value in (("--relays-per-stage", self.relays_per_stage), ("--data-holders", self.data_holders),
                            ("--microbatches-per-dh", self.microbatches_per_dh),
                            ("--target-microbatches", self.target_microbatches)):
            require(isinstance(value, int) and value >= 1, flag, f"must be an integer >= 1, got {value!r}")
        require(self.compute in COMPUTE_KINDS, "--compute", f"must be one of {', '.join(COMPUTE_KINDS)}")
        for flag, value in (("--churn", self.churn_pct_per_hour), ("--join-rate", self.join_rate_pct_per_hour)):
            require(math.isfinite(value) and 0 <= value <= 1000, flag, f"must be within 0..1000 %/h, got {value!r}")
        require_positive(self.horizon_s, "--horizon-s")
        require_positive(self.flow_tick_s, "--flow-tick-s")
        require(isinstance(self.max_slots, int) and self.max_slots >= 0, "--max-slots",
                "must be an integer >= 0 (0: no cap)")
        require(isinstance(self.min_replicas_after_crash, int) and self.min_replicas_after_crash >= 1,
                "--min-replicas", "must be an integer >= 1 (the paper assumes a live replica per stage)")

    @property
    def join_rate_pct_per_hour(self) -> float:
        return self.churn_pct_per_hour if self.join_pct_per_hour is None else self.join_pct_per_hour

    @property
    def demand(self) -> int:
        """Microbatches per iteration over all data holders."""
        return self.data_holders * self.microbatches_per_dh

    def flow_params(self) -> FlowParams:
        return FlowParams(tick_s=self.flow_tick_s)


def check_router(name: str) -> str:
    if name not in ROUTERS:
        raise ConfigError(f"--router: unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    return name
