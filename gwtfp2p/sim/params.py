"""Simulator configuration: frozen, validated dataclasses for the data plane, SWARM and a scenario.

Every value is checked once in ``__post_init__``; a ``ConfigError`` names the CLI flag and the fix.
Owns no behaviour: the engine, the routers and the scenarios read these objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gwtfp2p.config import WIRE_CODECS, ConfigError, CostSettling, FlowParams, require, require_positive
from gwtfp2p.sim.compute import get_model
from gwtfp2p.sim.network import NetworkSpec

CRASH_MODES = ("silent", "refused")
COMPUTE_KINDS = ("homogeneous", "heterogeneous")
ROUTERS = ("gwtf", "swarm", "oracle")  # what a run compares by default
SWARM_ROUTERS = ("swarm", "swarm-barrier")  # swarm-barrier: SWARM held to the shared iteration barrier
ALL_ROUTERS = (*ROUTERS, "swarm-barrier")


@dataclass(frozen=True, kw_only=True)
class DataPlaneParams:
    """How crashes show and what the shared data plane waits for."""

    crash_mode: str = "silent"
    """silent: the machine vanishes, nothing answers; refused: the process died, its host refuses
    connections at once and resets the open ones."""
    allreduce_failure_detect_s: float = 5.0
    """A replica dying mid-all-reduce is noticed after this long (hivemind's averager timeouts)."""

    def __post_init__(self) -> None:
        require(self.crash_mode in CRASH_MODES, "--crash-mode", f"must be one of {', '.join(CRASH_MODES)}")
        require(self.allreduce_failure_detect_s >= 0, "--allreduce-detect-s", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class SensingParams:
    """What a gwtf node measures of its neighbours, as the daemon measures it (gwtfp2p/daemon:
    ``links.py``, ``peers.py``, ``liveness.py``; docs/churn.md)."""

    refused_detect_mean_s: float = 1.2
    """Refused crashes: each node that deals with the dead one learns of the death after its own draw
    from a lognormal with this mean (docs/churn.md, 30 chaos runs: send -> loss detected 1.23 s)."""
    refused_detect_p95_s: float = 2.5
    """... and this 95th percentile (the same runs: 2.50 s)."""
    heartbeat_s: float = 2.0
    """Silent crashes: liveness records are refreshed every period and expire after two; a node
    reads them once a period (at its own phase), then pings the suspect."""
    ping_timeout_s: float = 5.0
    """A suspect that does not answer a ping within this is dead (daemon ``peers.PING_TIMEOUT_S``)."""
    probe_period_s: float = 8.0
    """Every neighbour is pinged this often and its edge cost re-measured (daemon: 4 flow ticks)."""
    probe_jitter_fraction: float = 0.1
    """A ping measures the round trip plus queueing: RTT x (1 + an exponential draw of this mean)."""
    rtt_ema_alpha: float = 0.3
    """Smoothing of the measured round trip (daemon ``LinkTable``)."""
    bandwidth_ema_alpha: float = 0.2
    """Smoothing of the bandwidth seen on activation transfers, queueing included (``LinkTable``)."""
    default_bandwidth_bytes_per_s: float = 1e9
    """Bandwidth assumed before a transfer was seen (daemon ``--bandwidth`` default)."""
    cost_settling: CostSettling = field(default_factory=CostSettling)
    """How a re-measured edge cost reaches the flow: the daemon's rule against noise
    (``gwtfp2p.flow.costs.SettledCosts``, the same class and defaults)."""

    def __post_init__(self) -> None:
        for flag, value in (("--detect-mean-s", self.refused_detect_mean_s),
                            ("--heartbeat-s", self.heartbeat_s), ("--ping-timeout-s", self.ping_timeout_s),
                            ("--probe-period-s", self.probe_period_s),
                            ("--default-bandwidth", self.default_bandwidth_bytes_per_s)):
            require_positive(value, flag)
        require(self.refused_detect_p95_s > self.refused_detect_mean_s, "--detect-p95-s",
                "must exceed --detect-mean-s (a right-skewed delay)")
        require(0 <= self.probe_jitter_fraction <= 10, "--probe-jitter", "must be within 0..10")
        for flag, value in (("--rtt-ema-alpha", self.rtt_ema_alpha),
                            ("--bandwidth-ema-alpha", self.bandwidth_ema_alpha)):
            require(0 < value <= 1, flag, "must be within (0, 1]")


@dataclass(frozen=True, kw_only=True)
class SwarmParams:
    """SWARM parallelism as released: each value cites its line of yandex-research/swarm (C =
    swarm/pipeline/src/moe/client, S = swarm/pipeline/src/moe/server, O = swarm/pipeline/src/optim)."""

    forward_timeout_s: float = 30.0
    """swarm/train_pipeline.py:21 TIMEOUT."""
    backward_timeout_s: float = 75.0
    """swarm/train_pipeline.py:22 BACKWARD_TIMEOUT = TIMEOUT * 2.5."""
    backward_task_multiplier: float = 2.5
    """C/balanced_expert.py:31 backward_task_size_multiplier (the heap's charge for a backward)."""
    ema_alpha: float = 0.1
    """O/performance_ema.py:14 PerformanceEMA alpha."""
    initial_seconds_per_sample: float = 1.0
    """C/balancer.py:22 initial_throughput, used as seconds per sample (C/balancer.py:125)."""
    balancer_update_period_s: float = 30.0
    """C/balanced_expert.py:30 update_period: each balancer re-reads the DHT this often."""
    declare_period_s: float = 30.0
    """S/__init__.py:63 update_period: servers re-declare their experts this often."""
    record_expiration_s: float = 300.0
    """S/dht_handler.py:37 declare_experts(expiration=300)."""
    trainers_per_dh: int = 0
    """Sequential trainer processes per data holder, one microbatch each in flight (the release
    starts 4 per machine, swarm/setup_and_launch_trainer.sh:21); 0: as many as the data holder's
    microbatches per iteration, so SWARM has as many in flight as gwtf's demand."""
    recompute: bool = True
    """Ablation switch, not SWARM: False charges a backward only its backward (servers that kept the
    activations). Used to attribute the ``ideal`` gap (docs/benchmarks.md)."""
    backward_to_forward_server: bool = False
    """Ablation switch, not SWARM: True sends a backward to its forward's server, past the heap."""

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
        require(isinstance(self.trainers_per_dh, int) and self.trainers_per_dh >= 0, "--swarm-trainers",
                "must be an integer >= 0 (0: one per microbatch of an iteration)")


@dataclass(frozen=True, kw_only=True)
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
    stage_compute_s: tuple[float, ...] = ()
    """Measured forward + backward seconds per microbatch of each stage's nodes (the data holders first,
    then stages 1..S), split 1 : 2 between forward and backward; empty: from the model and the GPU class."""
    flow_tick_s: float = 2.0
    flow_uplink_aware: bool = True
    """gwtf and the oracle price a node's shared uplink (``flow.load``): one more unit through a
    node waits for the ones it already sends. It matters only where uploads share an uplink (home)."""
    flow_iteration_budget_s: float = 0.0
    """With a budget, a node carries at most the units its GPU and uplink serve in this time (0: memory)."""
    codec: str = "none"
    """The wire codec of activations, gradients and the all-reduce (``RunSpec.forward_codec`` and friends):
    none sends what the GPUs compute (bf16, 2 bytes a value); blockwise8 about 1 byte."""
    dataplane: DataPlaneParams = field(default_factory=DataPlaneParams)
    sensing: SensingParams = field(default_factory=SensingParams)
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
        require(math.isfinite(self.flow_iteration_budget_s) and self.flow_iteration_budget_s >= 0,
                "--flow-iteration-budget-s", "must be a finite number of seconds >= 0 (0: memory alone bounds)")
        require(self.codec in WIRE_CODECS, "--codec", f"must be one of {', '.join(WIRE_CODECS)}, got {self.codec!r}")
        require(not self.stage_compute_s or (
            len(self.stage_compute_s) == self.n_stages + 1
            and all(math.isfinite(v) and v > 0 for v in self.stage_compute_s)), "--stage-compute-s",
            f"needs {self.n_stages + 1} positive finite seconds (data holders, then each stage) or none, "
            f"got {self.stage_compute_s!r}")
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
        return FlowParams(tick_s=self.flow_tick_s, iteration_budget_s=self.flow_iteration_budget_s)


def check_router(name: str) -> str:
    if name not in ALL_ROUTERS:
        raise ConfigError(f"--router: unknown router {name!r}; choose from {', '.join(ALL_ROUTERS)}")
    return name
