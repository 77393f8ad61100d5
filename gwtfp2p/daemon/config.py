"""How one daemon (``gwtf join``) runs: ``NodeConfig`` and its groups, every default stated once here.

``NodeConfig`` holds the node's role and model settings and three groups: ``NetworkConfig`` (where it
listens, whom it dials, link emulation), ``DataConfig`` (a data holder's shard and pacing),
``StorageConfig`` (checkpoints, steps kept for joiners), ``SecurityConfig`` and ``Timings``
(``timings.py``: every period, deadline and floor). All are frozen, keyword-only and validated once;
errors name the flag and the fix. The CLI passes only the flags a user gave; the rest take the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from gwtfp2p.config import ConfigError, require, require_positive
from gwtfp2p.daemon.timings import Timings

NODE_ROLES = ("data", "relay")
DEVICES = ("cpu", "cuda", "auto")
DEFAULT_RELAY_CAPACITY = 16
REACHABILITY_MODES = ("auto", "direct", "relayed")
@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkConfig:
    """Where the node listens, whom it dials first, and the emulated location of its links."""

    initial_peers: tuple[str, ...] = ()
    """Multiaddrs of running peers (``--initial-peers``); none: this node starts a new swarm."""
    host: str = "127.0.0.1"
    """Address to listen on (``--host``; 0.0.0.0 for every interface)."""
    port: int = 0
    """TCP port to listen on (``--port``; 0 picks a free one)."""
    announce_maddrs: tuple[str, ...] = ()
    """Multiaddrs others should dial, e.g. behind a port mapping (``--announce``)."""
    identity_path: str = ""
    """Key file of a stable peer id, created if missing (``--identity``; empty: the user's default key,
    ``$XDG_DATA_HOME/gwtf/identity.key``, or a new id for this run if another node here holds it)."""
    location: str = ""
    """Emulate links as if this node were in this geo10 location (``--location``; empty: no emulation)."""
    location_scale: float = 1.0
    """Scale factor of the emulated delays (``--link-scale``)."""
    default_bandwidth_bytes_per_s: float = 1e9
    """Bandwidth assumed for a link until a transfer over it is measured (``--bandwidth``)."""
    metrics_port: int | None = None
    """TCP port of the Prometheus endpoint ``http://HOST:PORT/metrics``, on ``host`` (``--metrics-port``;
    None: no endpoint; 0: any free port, reported in the ``ready`` event)."""
    reachability: str = "auto"
    """How peers reach this node (``--reachability``): ``auto`` asks peers to dial it back when it joins
    beyond loopback; ``direct`` and ``relayed`` skip the check (``relayed``: its initial peers relay)."""
    relay_for_others: bool = True
    """A directly reachable node relays circuits for nodes behind NATs (``--relay-for-others/--no-...``)."""
    relay_max_circuits: int = 16
    """Relayed connections open at once per peer that reserved a slot with this node (p2pd's default)."""

    def __post_init__(self) -> None:
        require(all(isinstance(p, str) and p.startswith("/") for p in self.initial_peers), "--initial-peers",
                "each peer is a multiaddr such as /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...")
        require(bool(self.host) and " " not in self.host, "--host", "give an IPv4 address such as 0.0.0.0")
        require(isinstance(self.port, int) and 0 <= self.port <= 65535, "--port",
                f"must be within 0..65535 (0 picks a free port), got {self.port!r}")
        require(all(isinstance(a, str) and a.startswith("/") for a in self.announce_maddrs), "--announce",
                "each address is a multiaddr such as /ip4/203.0.113.7/tcp/31337")
        require(self.location_scale >= 0 and math.isfinite(self.location_scale), "--link-scale",
                "must be a finite number >= 0 (0 disables the emulated delay)")
        require_positive(self.default_bandwidth_bytes_per_s, "--bandwidth")
        require(self.metrics_port is None or (isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535),
                "--metrics-port", f"must be within 0..65535 (0 picks a free port), got {self.metrics_port!r}")
        require(self.reachability in REACHABILITY_MODES, "--reachability",
                f"use one of {', '.join(REACHABILITY_MODES)}, got {self.reachability!r}")
        require(isinstance(self.relay_max_circuits, int) and self.relay_max_circuits >= 1, "--relay-max-circuits",
                f"must be an integer >= 1, got {self.relay_max_circuits!r}")

    @property
    def host_maddrs(self) -> tuple[str, ...]:
        return (f"/ip4/{self.host}/tcp/{self.port}",)


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """A data holder's slice of the data and when it trains."""

    shard: int = 0
    """Index of this data holder's slice of the data (``--shard INDEX/COUNT``)."""
    n_shards: int = 1
    """Number of slices the data is cut into (``--shard INDEX/COUNT``)."""
    max_iterations: int = 0
    """Stop training after this many iterations (``--max-iterations``; 0: until stopped)."""
    min_nodes: int = 0
    """Start the first iteration once the run has this many online nodes, itself included (``--min-nodes``)."""

    def __post_init__(self) -> None:
        require(isinstance(self.n_shards, int) and self.n_shards >= 1, "--shard",
                "the shard count must be >= 1, as in --shard 0/2")
        require(isinstance(self.shard, int) and 0 <= self.shard < self.n_shards, "--shard",
                f"the shard index must be within 0..{self.n_shards - 1}, as in --shard 1/{self.n_shards}")
        require(isinstance(self.max_iterations, int) and self.max_iterations >= 0, "--max-iterations",
                "must be an integer >= 0 (0: train until stopped)")
        require(isinstance(self.min_nodes, int) and self.min_nodes >= 0, "--min-nodes",
                "must be an integer >= 0 (0: start as soon as a route exists)")


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageConfig:
    """What a node keeps of its part: local checkpoints and the last steps for joiners."""

    checkpoint_dir: str = ""
    """Directory of this node's local checkpoint of its part (``--checkpoint-dir``; empty: none)."""
    checkpoint_every: int = 10
    """Steps between local checkpoints (``--checkpoint-every``)."""
    replay_steps: int = 4
    """Last steps kept in RAM (one mean gradient each) for joiners to replay, at least (``--replay-steps``;
    0: none)."""
    replay_budget_mib: int = 64
    """RAM for more kept steps than ``replay_steps`` (``--replay-budget-mib``): a small part steps several
    times while a joiner downloads its state, so it keeps as many as fit (up to 256); a 124m stage's mean
    gradient alone is ~120 MiB, so it keeps ``replay_steps``."""

    def __post_init__(self) -> None:
        require(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1, "--checkpoint-every",
                f"must be an integer >= 1 (steps between checkpoints), got {self.checkpoint_every!r}")
        require(isinstance(self.replay_steps, int) and self.replay_steps >= 0, "--replay-steps",
                f"must be an integer >= 0 (steps kept for joiners to replay; 0: none), got {self.replay_steps!r}")
        require(isinstance(self.replay_budget_mib, int) and self.replay_budget_mib >= 0, "--replay-budget-mib",
                f"must be an integer >= 0 (MiB of RAM for more kept steps; 0: only --replay-steps), "
                f"got {self.replay_budget_mib!r}")
        require(not self.checkpoint_dir or "\0" not in self.checkpoint_dir, "--checkpoint-dir",
                "give a directory path (it is created if missing)")


@dataclass(frozen=True, kw_only=True, slots=True)
class SecurityConfig:
    """What a node checks of its peers in an open swarm (docs/security.md)."""

    signatures: bool = True
    """Sign this node's DHT records and contributions and verify everyone else's, and load a joined state
    only if a majority of its stage's records vouch for it (``--no-signatures`` turns these off, to measure
    their cost; every node of a swarm must agree)."""
    cross_check_fraction: float = 0.0
    """A data holder also sends this fraction of its microbatches' activations to a second replica of the
    first stage, and, on a mismatch, to a third, and compares the outputs (``--cross-check``; 0: none)."""
    unproductive_probes: int = 3
    """A next hop that answered this many probes about late gradients, and returned no gradient since the
    oldest of them was sent, is failed for routing (excluded) although it answers pings."""
    exclude_s: float = 600.0
    """How long a peer excluded for misbehaviour (no progress, a lie) counts as dead, heartbeats or not."""
    permissioned_by: str = ""
    """A permissioned run: the peer id of its creator, whose signed list of admitted peers this node follows
    (``--permissioned PEER``; empty: an open run)."""
    admit_path: str = ""
    """This node created a permissioned run: the file of the peer ids it admits, one per line, published
    and re-read at every heartbeat (``--admit FILE``)."""

    def __post_init__(self) -> None:
        require(isinstance(self.signatures, bool), "--no-signatures", "is a switch")
        require(isinstance(self.cross_check_fraction, (int, float)) and 0 <= self.cross_check_fraction <= 1,
                "--cross-check", f"must be a fraction within [0, 1], got {self.cross_check_fraction!r}")
        require(isinstance(self.unproductive_probes, int) and self.unproductive_probes >= 1,
                "SecurityConfig.unproductive_probes", "must be an integer >= 1")
        require_positive(self.exclude_s, "SecurityConfig.exclude_s")
        require(not (self.permissioned_by and self.admit_path), "--permissioned",
                "a run's creator gives --admit FILE; the other nodes give --permissioned CREATOR_PEER_ID")
        require(not self.admit_path or Path(self.admit_path).is_file(), "--admit",
                f"give a file of admitted peer ids, one per line (no file at {self.admit_path!r})")


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    """One daemon: its role and part, its model settings, and the groups above."""

    role: str = "relay"
    """``data`` (a data holder: head, tail and data) or ``relay`` (serves one stage) (``--role``)."""
    stage: int | None = None
    """The stage a relay serves; None: ``--stage auto``, chosen from the swarm's flow. Data holders: 0."""
    capacity: int = 0
    """Microbatches per iteration a relay can hold (``--capacity``; 0: the default of 16)."""
    device: str = "cpu"
    """Torch device of the part (``--device``: cpu, cuda, cuda:N or auto)."""
    torch_threads: int = 1
    """Torch threads of the compute thread (``--torch-threads``; 0: torch's default)."""
    run_spec_path: str = ""
    """JSON run spec, read by the first data holder of a run (``--run-spec``; empty: the demo spec)."""
    new_run: bool = False
    """A data holder starts a new run through its initial peers, any bootstrap peer (``--new-run``)."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """Listening, dialling and link emulation."""
    data: DataConfig = field(default_factory=DataConfig)
    """A data holder's shard and pacing."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Checkpoints and the steps kept for joiners."""
    timings: Timings = field(default_factory=Timings)
    """Every period and deadline."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """What the node checks of its peers."""

    def __post_init__(self) -> None:
        require(self.role in NODE_ROLES, "--role", f"must be one of {', '.join(NODE_ROLES)}, got {self.role!r}")
        if self.role == "data":
            require(self.stage in (None, 0), "--stage", "a data holder serves stage 0; drop --stage or use 0")
        else:
            require(self.stage is None or (isinstance(self.stage, int) and self.stage >= 1), "--stage",
                    f"a relay serves a stage >= 1 (or 'auto'), got {self.stage!r}")
        require(self.is_data_holder or bool(self.network.initial_peers), "--initial-peers",
                "a relay joins a running swarm: give the address a running node printed (/ip4/.../p2p/...)")
        require(self.device in DEVICES or self.device.startswith("cuda:"), "--device",
                f"use cpu, cuda, cuda:N or auto, got {self.device!r}")
        require(isinstance(self.capacity, int) and self.capacity >= 0, "--capacity",
                f"must be an integer >= 0 (0: default), got {self.capacity!r}")
        require(isinstance(self.torch_threads, int) and self.torch_threads >= 0, "--torch-threads",
                "must be an integer >= 0 (0: torch's default)")
        require(self.data.min_nodes == 0 or self.is_data_holder, "--min-nodes", "only a data holder waits for nodes")
        require(not self.new_run or self.is_data_holder, "--new-run", "only a data holder starts a run (--role data)")

    @property
    def is_data_holder(self) -> bool:
        return self.role == "data"

    @property
    def relay_capacity(self) -> int:
        return self.capacity or DEFAULT_RELAY_CAPACITY


__all__ = ["ConfigError", "DataConfig", "NetworkConfig", "NodeConfig", "SecurityConfig", "StorageConfig", "Timings"]
