"""``gwtf status``: the swarm as the DHT sees it (a client-mode read), as tables, ``--json``, a picture or a live page.

Stages (replicas, capacity, compute times, replica hashes compared at equal iterations), nodes
(state, iteration, location, hash, sync, link RTTs), the routing (who sends to whom, how many
units, the link's RTT), iteration, loss and throughput, and the routing's cost next to the
oracle's. ``--svg``/``--png`` draw the routing; ``--serve`` follows the swarm on a local web page
(``gwtf_cli.web``); ``--simulate N`` shows a made-up swarm of N nodes instead of reading the DHT.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import uvloop
from rich.console import Console
from rich.table import Table

from gwtfp2p.ids import short_peer_id as short

DEFAULT_PORT = 8377


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _replica(peer: str, stage: dict[str, Any]) -> str:
    verdict = stage.get("sync", {}).get("replicas", {}).get(peer, {})
    status = verdict.get("status", "")
    mark = "" if status in ("in_sync", "") else f"[{'red' if status == 'diverged' else 'yellow'}]({status})[/]"
    return f"{short(peer)}{mark}"


def render(summary: dict[str, Any], console: Console) -> None:
    flow, spec = summary["flow"], summary["spec"]
    console.print(f"[bold]run {summary['run_id']}[/]  {spec['model_family']}-{spec['model_preset']}"
                  f"  {spec['n_stages']} stages  iteration {summary['iteration']}  loss "
                  f"{_fmt(summary['loss'], 4)}  {summary['tokens_per_s']:.0f} tok/s  replicas in sync: "
                  f"{'yes' if summary['replicas_in_sync'] else '[red]NO[/]'}")
    console.print(f"flow: {flow['units']} units, cost {_fmt(flow['cost_s'], 4)} s  (oracle: {flow['oracle_units']} "
                  f"units, {_fmt(flow['oracle_cost_s'], 4)} s)")
    relayed = sum(bool(n.get("relayed")) for n in summary["nodes"])
    console.print(f"reachability: {len(summary['nodes']) - relayed} node(s) reachable directly, {relayed} behind a "
                  f"NAT reached through relays (docs/networking.md)")
    if summary["unserved_stages"]:
        console.print(f"[red]no replica serves stage(s) {summary['unserved_stages']}: the swarm waits[/]")
    stages = Table("stage", "replicas", "capacity", "compute ms", "hashes", "in sync", title="stages")
    for s in summary["stages"]:
        state = s.get("sync", {}).get("state", "in_sync" if s["in_sync"] else "NO")
        stages.add_row(str(s["stage"]), " ".join(_replica(p, s) for p in s["replicas"]), str(s["capacity"]),
                       " ".join(f"{c:.1f}" for c in s["compute_ms"]),
                       " ".join(sorted(set(s["hashes"].values()))), "yes" if s["in_sync"] else f"[red]{state}[/]")
    console.print(stages)
    for line in summary.get("sync_problems", []):
        console.print(f"[red]{line}[/]", highlight=False)
    for e in summary.get("excluded", []):
        console.print(f"[red]{short(e['peer'])} excluded by {short(e['by'])}: {e['reason']}[/]", highlight=False)
    nodes = Table("peer", "role", "stage", "state", "iter", "cap", "ms", "location", "hash", "sync", "units",
                  title="nodes (ms: compute per microbatch; units: flow units sent on)")
    for n in summary["nodes"]:
        state = n["state"] + (" relayed" if n.get("relayed") else "")
        nodes.add_row(short(n["peer_id"]), n["role"], str(n["stage"]), state, str(n["iteration"]),
                      str(n["capacity"]), f"{n['compute_ms']:.1f}", n["location"] or "-", n["hash"] or "-",
                      n.get("sync", "-"), str(n["units_out"]))
    console.print(nodes)
    routing = Table("from", "to", "sink", "units", "RTT ms", "cost ms", title="routing (who sends to whom)")
    for r in summary["routing"]:
        cost = r.get("cost_s")
        routing.add_row(short(r["from"]), short(r["to"]), short(r["sink"]), str(r["units"]), _fmt(r["rtt_ms"], 1),
                        _fmt(None if cost is None else cost * 1000, 1))
    console.print(routing)


async def _read(peers: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    from gwtfp2p.daemon.status import read_swarm, summarize

    return summarize(await read_swarm(peers, timeout_s))


def _fail(message: str, code: int = 1) -> typer.Exit:
    print(f"gwtf status: {message}", file=sys.stderr)
    return typer.Exit(code)


def status(
    initial_peers: list[str] = typer.Option([], "--initial-peers", help="multiaddr(s) of any running peer"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of tables"),
    timeout_s: float = typer.Option(30.0, help="seconds to wait for the DHT (each live read: a third of it)"),
    svg: Path | None = typer.Option(None, "--svg", help="also draw the routing into this SVG file"),
    png: Path | None = typer.Option(None, "--png", help="also draw the routing into this PNG file"),
    serve: bool = typer.Option(False, "--serve", help="serve a live web page of the swarm until Ctrl-C"),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="with --serve: the page's port (0: any free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="with --serve: the address to listen on"),
    interval_s: float = typer.Option(2.0, "--interval-s", help="with --serve: seconds between reads of the DHT"),
    simulate: int = typer.Option(0, "--simulate", help="show a made-up swarm of N nodes instead of reading the DHT"),
) -> None:
    """Show the swarm: stages, replicas, routing, iteration, loss, throughput, replica hashes."""
    from gwtfp2p.config import ConfigError
    from gwtfp2p.daemon.status import NoRunError
    from gwtfp2p.dht import DHTError

    peers = tuple(p.strip() for value in initial_peers for p in value.split(",") if p.strip())
    if not peers and not simulate:
        raise _fail("--initial-peers: give the multiaddr of any running peer (or --simulate N for a made-up swarm)", 2)
    if serve and (as_json or svg or png):
        raise _fail("--serve shows the swarm live: drop --json/--svg/--png (the page serves /status.json)", 2)
    if interval_s <= 0 or not 0 <= port <= 65535:
        raise _fail("--interval-s must be > 0 and --port within 0..65535", 2)
    try:
        if serve:
            _serve(peers, simulate, port, host, interval_s, timeout_s)
            return
        summary = _simulated(simulate)() if simulate else uvloop.run(_read(peers, timeout_s))
    except (DHTError, NoRunError, ConfigError, ValueError) as e:
        raise _fail(str(e)) from None
    _pictures(summary, svg, png, to_stderr=as_json)
    if as_json:
        print(json.dumps(summary, default=str))
    else:
        render(summary, Console())


def _simulated(n_nodes: int) -> Callable[[], dict[str, Any]]:
    from gwtf_cli.web.simulated import SimulatedSwarm

    return SimulatedSwarm(n_nodes).summary


def _pictures(summary: dict[str, Any], svg: Path | None, png: Path | None, to_stderr: bool) -> None:
    from gwtf_cli.web.render import write_png, write_svg

    for path, write in ((svg, write_svg), (png, write_png)):
        if path is None:
            continue
        try:
            write(summary, path)
        except OSError as e:
            raise _fail(f"cannot write {path}: {e.strerror or e}") from None
        except ImportError:
            raise _fail("--png draws with matplotlib: pip install 'gwtfp2p[plots]' (or use --svg)") from None
        print(f"wrote {path}", file=sys.stderr if to_stderr else sys.stdout)


def _serve(peers: tuple[str, ...], simulate: int, port: int, host: str, interval_s: float, timeout_s: float) -> None:
    """Serve the page until Ctrl-C or SIGTERM; the DHT is joined first (before any thread starts)."""
    from gwtf_cli.web import serve_status
    from gwtf_cli.web.dht_reader import DHTReader

    reader = None if simulate else DHTReader.open(peers, startup_timeout_s=timeout_s, read_timeout_s=timeout_s / 3)
    try:
        handle = serve_status(_simulated(simulate) if reader is None else reader, port, host=host,
                              interval_s=interval_s)
    except OSError as e:
        if reader is not None:
            reader.close()
        raise _fail(f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e}); pick another --port "
                    f"or stop the program using it") from None
    stop = threading.Event()  # Ctrl-C and SIGTERM set it (no KeyboardInterrupt can land mid-wait or mid-close)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(f"gwtf status: serving {handle.url} (Ctrl-C stops)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("gwtf status: stopping", file=sys.stderr, flush=True)
        if handle.close() and reader is not None:
            reader.close()
