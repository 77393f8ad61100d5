"""``gwtf join``: run one daemon (data holder or relay) until Ctrl-C / SIGTERM.

Builds a ``NodeConfig`` from the flags (errors name the flag and the fix), runs the node on a
uvloop event loop and shows one progress line (``--json``: every event as a JSON line, which the
demo and the tests read). Usual failures end with one line and a non-zero exit code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

import typer
import uvloop

from gwtfp2p.config import ConfigError, NodeConfig

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


async def _run(config: NodeConfig, sink: ProgressLine) -> None:
    from gwtfp2p.daemon.events import Events
    from gwtfp2p.daemon.node import run_node
    from gwtfp2p.daemon.signals import install_stop_signals

    stop = asyncio.Event()
    install_stop_signals(stop)
    await run_node(config, Events(sink), stop)


def join(
    role: str = typer.Option("relay", help="data (data holder: head, tail, data) or relay (serves one stage)"),
    stage: str = typer.Option("auto", help="stage to serve: 'auto' (the swarm's bottleneck) or a number"),
    initial_peers: list[str] = typer.Option([], "--initial-peers", help="multiaddr(s) of running peers"),
    host: str = typer.Option("127.0.0.1", help="address to listen on (0.0.0.0 for all interfaces)"),
    port: int = typer.Option(0, help="TCP port to listen on (0: any free port)"),
    announce: list[str] = typer.Option([], "--announce", help="multiaddr(s) others should dial (port mapping)"),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto"),
    capacity: int = typer.Option(0, help="microbatches per iteration this relay can hold (0: 16)"),
    identity: str = typer.Option("", help="identity key file for a stable peer id (created if missing)"),
    run_spec: str = typer.Option("", "--run-spec", help="JSON run spec (first data holder; default: demo spec)"),
    location: str = typer.Option("", help="emulate links as if this node were in this geo10 location"),
    link_scale: float = typer.Option(1.0, help="scale factor of the emulated delays"),
    tick_s: float = typer.Option(1.0, help="seconds between flow-protocol ticks"),
    heartbeat_s: float = typer.Option(5.0, help="seconds between DHT heartbeats"),
    shard: str = typer.Option("0/1", help="data holder's slice of the data, INDEX/COUNT"),
    max_iterations: int = typer.Option(0, help="data holder: stop training after this many iterations"),
    min_nodes: int = typer.Option(0, help="data holder: start training once this many nodes are online"),
    torch_threads: int = typer.Option(1, help="torch threads of the compute thread (0: torch's default)"),
    grace_s: float = typer.Option(10.0, help="seconds to finish in-flight work when leaving"),
    bandwidth: float = typer.Option(1e9, help="bytes/s assumed for links until a transfer is measured"),
    checkpoint_dir: str = typer.Option("", "--checkpoint-dir",
                                       help="keep a local checkpoint of this relay's stage here (restored when "
                                            "joining a stage that has no live replica)"),
    checkpoint_every: int = typer.Option(10, "--checkpoint-every", help="steps between local checkpoints"),
    replay_steps: int = typer.Option(4, "--replay-steps",
                                     help="last steps kept (one mean gradient each, in RAM) for joiners to replay"),
    as_json: bool = typer.Option(False, "--json", help="print every event as a JSON line"),
    log_level: str = typer.Option("WARNING", help="log level of the daemon (stderr)"),
) -> None:
    """Join a swarm (or start one, as the first data holder) and train until Ctrl-C."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        index, count = parse_shard(shard)
        config = NodeConfig(role=role, stage=parse_stage(stage) if role != "data" else None,
                            initial_peers=split_multi(initial_peers), host=host, port=port,
                            announce_maddrs=split_multi(announce), device=device, capacity=capacity,
                            identity_path=identity, run_spec_path=run_spec, location=location,
                            location_scale=link_scale, tick_s=tick_s, heartbeat_s=heartbeat_s, shard=index,
                            n_shards=count, max_iterations=max_iterations, min_nodes=min_nodes,
                            torch_threads=torch_threads,
                            grace_s=grace_s, default_bandwidth_bytes_per_s=bandwidth,
                            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                            replay_steps=replay_steps)
    except ConfigError as e:
        print(f"gwtf join: {e}", file=sys.stderr)
        raise typer.Exit(EXIT_CONFIG) from None
    os.environ.setdefault("GWTF_HIVEMIND_LOG_LEVEL", "CRITICAL")
    try:
        uvloop.run(_run(config, ProgressLine(as_json)))
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
