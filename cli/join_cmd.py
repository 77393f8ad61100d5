"""``gwtf join``: run one daemon (data holder or relay) until Ctrl-C / SIGTERM.

Builds a ``NodeConfig`` from the flags given (the others take the config's defaults, stated once in
``gwtfp2p.daemon.config``; errors name the flag and the fix), runs the node on a uvloop event loop
and shows it: a live screen on a terminal (``live_screen``), one line per event otherwise, every
event as a JSON line with ``--json`` (what the demo and the tests read). Usual failures end with one
line and a non-zero exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import typer
import uvloop

from gwtf_cli.heartbeat import with_heartbeat
from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.config import DataConfig, NetworkConfig, NodeConfig, SecurityConfig, StorageConfig, Timings

EXIT_CONFIG = 2
EXIT_FAILED = 1


def parse_stage(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--stage: use 'auto' or a stage number, got {text!r}") from None


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard: use INDEX/COUNT such as 0/2, got {text!r}") from None
    return index, count


def split_multi(values: list[str]) -> tuple[str, ...]:
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


class ProgressLine:
    """Human output: one line rewritten in place (a terminal) or one line per iteration/step."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.tty = sys.stdout.isatty()

    def __call__(self, event: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(event, default=str), flush=True)
            return
        line = describe(event)
        if not line:
            return
        if self.tty and event["event"] in ("progress", "iteration", "step", "waiting"):
            print("\r" + line[:150].ljust(150), end="", flush=True)
        else:
            print(("\n" if self.tty else "") + line, flush=True)


def describe(event: dict[str, Any]) -> str:
    name = event["event"]
    if name == "ready":
        return (f"{event['role']} {event['peer_id']} serves stage {event['stage']} ({event['stage_reason']}); "
                f"run {event['run_id']}; join with --initial-peers {event['maddrs'][0] if event['maddrs'] else '?'}")
    if name == "iteration":
        return (f"iteration {event['iteration']:>5}  loss {event['loss']:.4f}  {event['tokens_per_s']:8.0f} tok/s  "
                f"{event['units']} unit(s)  {event['seconds']:.2f} s")
    if name == "step":
        return (f"stage {event['stage']} step {event['iteration']:>5}  hash {event['hash']}  "
                f"{event['count']} microbatches")
    if name == "progress" and event.get("role") == "relay":
        return (f"stage {event['stage']}  iteration {event['iteration']}  fwd {event.get('forwards', 0)} "
                f"bwd {event.get('backwards', 0)}  units {event['units']}  peers {event['peers']}  "
                f"compute {event['compute_ms']} ms")
    if name == "waiting":
        return f"waiting: {event['reason']}"
    if name in ("leaving", "stopped", "training_done"):
        return f"{name} at iteration {event['iteration']}"
    return ""


@contextlib.contextmanager
def event_output(as_json: bool) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Where the node's events go: JSON lines (``--json``), the live screen on a terminal, else one line each."""
    if as_json or not sys.stdout.isatty():
        yield ProgressLine(as_json)
        return
    from gwtf_cli.live_screen import LiveScreen

    with LiveScreen() as screen:
        yield screen


async def _run(config: NodeConfig, sink: Callable[[dict[str, Any]], None]) -> None:
    from gwtfp2p.daemon.events import Events
    from gwtfp2p.daemon.lifecycle.node import run_node
    from gwtfp2p.daemon.lifecycle.signals import install_stop_signals

    stop = asyncio.Event()
    install_stop_signals(stop)
    await run_node(config, Events(sink), stop)


def _default(cls: type, name: str) -> Any:
    """The default of a config field, as the config states it (help texts quote it; never restated)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _given(**values: Any) -> dict[str, Any]:
    """The flags the user gave (typer passes None for the others, which take the config's defaults)."""
    return {k: v for k, v in values.items() if v is not None}


def _opt(cls: type, name: str, help_text: str, *flags: str) -> Any:
    return typer.Option(None, *flags, help=f"{help_text} (default: {_default(cls, name)!r})", show_default=False)


def build_config(role: str | None, stage: str | None, initial_peers: list[str], host: str | None, port: int | None,
                 announce: list[str], device: str | None, capacity: int | None, identity: str | None,
                 run_spec: str | None, location: str | None, link_scale: float | None, tick_s: float | None,
                 heartbeat_s: float | None, shard: str | None, max_iterations: int | None, min_nodes: int | None,
                 torch_threads: int | None, grace_s: float | None, bandwidth: float | None,
                 startup_timeout_s: float | None, checkpoint_dir: str | None, checkpoint_every: int | None,
                 replay_steps: int | None, metrics_port: int | None = None, *, new_run: bool | None = None,
                 reachability: str | None = None, relay_for_others: bool | None = None,
                 signatures: bool | None = None, cross_check: float | None = None, permissioned: str | None = None,
                 admit: str | None = None, replay_budget_mib: int | None = None) -> NodeConfig:
    """A ``NodeConfig`` from the flags given; ``ConfigError`` names the flag and the fix."""
    role = role or _default(NodeConfig, "role")
    index, count = parse_shard(shard) if shard is not None else (None, None)
    network = NetworkConfig(**_given(initial_peers=split_multi(initial_peers) or None, host=host, port=port,
                                     announce_maddrs=split_multi(announce) or None, identity_path=identity,
                                     location=location, location_scale=link_scale,
                                     default_bandwidth_bytes_per_s=bandwidth, metrics_port=metrics_port,
                                     reachability=reachability, relay_for_others=relay_for_others))
    data = DataConfig(**_given(shard=index, n_shards=count, max_iterations=max_iterations, min_nodes=min_nodes))
    storage = StorageConfig(**_given(checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                     replay_steps=replay_steps, replay_budget_mib=replay_budget_mib))
    timings = Timings(**_given(tick_s=tick_s, heartbeat_s=heartbeat_s, grace_s=grace_s,
                               startup_timeout_s=startup_timeout_s))
    security = SecurityConfig(**_given(signatures=signatures, cross_check_fraction=cross_check,
                                       permissioned_by=permissioned, admit_path=admit))
    return NodeConfig(role=role, stage=parse_stage(stage or "auto") if role != "data" else None,
                      **_given(device=device, capacity=capacity, torch_threads=torch_threads, run_spec_path=run_spec,
                               new_run=new_run),
                      network=network, data=data, storage=storage, timings=timings, security=security)


def join(
    role: str = _opt(NodeConfig, "role", "data (data holder: head, tail, data) or relay (serves one stage)"),
    stage: str = typer.Option(None, help="stage to serve: 'auto' (the swarm's bottleneck) or a number "
                                         "(default: auto)", show_default=False),
    initial_peers: list[str] = typer.Option([], "--initial-peers", help="multiaddr(s) of running peers"),
    host: str = _opt(NetworkConfig, "host", "address to listen on (0.0.0.0 for all interfaces)"),
    port: int = _opt(NetworkConfig, "port", "TCP port to listen on (0: any free port)"),
    announce: list[str] = typer.Option([], "--announce", help="multiaddr(s) others should dial (port mapping)"),
    device: str = _opt(NodeConfig, "device", "cpu, cuda, cuda:N or auto"),
    capacity: int = _opt(NodeConfig, "capacity", "microbatches per iteration this relay can hold (0: 16)"),
    identity: str = _opt(NetworkConfig, "identity_path", "identity key file for a stable peer id (created 0600 if "
                         "missing; empty: $XDG_DATA_HOME/gwtf/identity.key)", "--identity"),
    run_spec: str = _opt(NodeConfig, "run_spec_path", "JSON run spec (a data holder starting a run; empty: the "
                         "demo spec); a joining node given it joins only that run", "--run-spec"),
    new_run: bool = typer.Option(False, "--new-run", help="data holder: start a new run through --initial-peers "
                                 "(any bootstrap peer, a stock hivemind-dht included)"),
    reachability: str = _opt(NetworkConfig, "reachability", "auto (peers dial this node back when it joins), "
                             "direct or relayed (no check)", "--reachability"),
    relay_for_others: bool = typer.Option(None, "--relay-for-others/--no-relay-for-others", show_default=False,
                                          help="relay for nodes behind NATs when this node is reachable "
                                               f"(default: {_default(NetworkConfig, 'relay_for_others')!r})"),
    location: str = _opt(NetworkConfig, "location", "emulate links as if this node were in this geo10 location"),
    link_scale: float = _opt(NetworkConfig, "location_scale", "scale factor of the emulated delays"),
    tick_s: float = _opt(Timings, "tick_s", "seconds between flow-protocol ticks"),
    heartbeat_s: float = _opt(Timings, "heartbeat_s", "seconds between DHT heartbeats"),
    shard: str = typer.Option(None, help="data holder's slice of the data, INDEX/COUNT (default: 0/1)",
                              show_default=False),
    max_iterations: int = _opt(DataConfig, "max_iterations", "data holder: stop training after this many iterations"),
    min_nodes: int = _opt(DataConfig, "min_nodes", "data holder: start training once this many nodes are online"),
    torch_threads: int = _opt(NodeConfig, "torch_threads", "torch threads of the compute thread (0: torch's default)"),
    grace_s: float = _opt(Timings, "grace_s", "seconds to finish in-flight work when leaving"),
    bandwidth: float = _opt(NetworkConfig, "default_bandwidth_bytes_per_s",
                            "bytes/s assumed for links until a transfer is measured"),
    startup_timeout_s: float = _opt(Timings, "startup_timeout_s",
                                    "seconds to reach the DHT and find the run in it", "--startup-timeout-s"),
    checkpoint_dir: str = _opt(StorageConfig, "checkpoint_dir",
                               "keep a local checkpoint of this node's part here (restored when joining a stage "
                               "that has no live replica)", "--checkpoint-dir"),
    checkpoint_every: int = _opt(StorageConfig, "checkpoint_every", "steps between local checkpoints",
                                 "--checkpoint-every"),
    replay_steps: int = _opt(StorageConfig, "replay_steps", "last steps kept (one mean gradient each, in RAM) "
                             "for joiners to replay, at least", "--replay-steps"),
    replay_budget_mib: int = _opt(StorageConfig, "replay_budget_mib", "MiB of RAM for more kept steps than "
                                  "--replay-steps (small models step several times during a joiner's download)",
                                  "--replay-budget-mib"),
    metrics_port: int = _opt(NetworkConfig, "metrics_port", "serve Prometheus metrics at http://HOST:PORT/metrics "
                             "(0: any free port; none: no metrics)", "--metrics-port"),
    no_signatures: bool = typer.Option(False, "--no-signatures", help="neither sign nor verify records and "
                                       "contributions (measurements only; every node of the swarm must agree)"),
    cross_check: float = _opt(SecurityConfig, "cross_check_fraction", "data holder: fraction of microbatches "
                              "whose first-stage outputs two replicas compute and compare", "--cross-check"),
    permissioned: str = _opt(SecurityConfig, "permissioned_by", "a permissioned run: its creator's peer id (only "
                             "the peers it admits take part)", "--permissioned"),
    admit: str = _opt(SecurityConfig, "admit_path", "the creator of a permissioned run: a file of the peer ids it "
                      "admits, one per line (re-read at every heartbeat)", "--admit"),
    as_json: bool = typer.Option(False, "--json", help="print every event as a JSON line"),
    log_level: str = typer.Option("WARNING", help="log level of the daemon (stderr)"),
    heartbeat_file: str = typer.Option(None, "--heartbeat-file",
                                       help="rewrite this JSON file on every event once ready (at most once a "
                                            "second), for health checks: python -m gwtf_cli.heartbeat FILE"),
) -> None:
    """Join a swarm (or start one, as the first data holder) and train until Ctrl-C."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(role, stage, initial_peers, host, port, announce, device, capacity, identity, run_spec,
                              location, link_scale, tick_s, heartbeat_s, shard, max_iterations, min_nodes,
                              torch_threads, grace_s, bandwidth, startup_timeout_s, checkpoint_dir,
                              checkpoint_every, replay_steps, metrics_port, new_run=new_run or None,
                              reachability=reachability, relay_for_others=relay_for_others,
                              signatures=False if no_signatures else None, cross_check=cross_check,
                              permissioned=permissioned, admit=admit, replay_budget_mib=replay_budget_mib)
    except ConfigError as e:
        print(f"gwtf join: {e}", file=sys.stderr)
        raise typer.Exit(EXIT_CONFIG) from None
    os.environ.setdefault("GWTF_HIVEMIND_LOG_LEVEL", "CRITICAL")
    try:
        with event_output(as_json) as show:
            uvloop.run(_run(config, with_heartbeat(show, heartbeat_file)))
    except KeyboardInterrupt:
        pass
    except Exception as e:
        if not _is_usual_failure(e):
            raise
        print(f"\ngwtf join: {e}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED) from None


def _is_usual_failure(e: Exception) -> bool:
    from gwtfp2p.dht import DHTError

    return isinstance(e, (ConfigError, DHTError, MemoryError))


if __name__ == "__main__":  # ``python -m gwtf_cli.join_cmd``: what local swarms start (skips other commands' imports)
    typer.run(join)
