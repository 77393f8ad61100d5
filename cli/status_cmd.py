"""``gwtf status``: the swarm as the DHT sees it (a client-mode read), as tables or ``--json``.

Stages (replicas, capacity, compute times, replica hashes in sync), nodes (state, iteration,
location, hash, link RTTs), the routing (who sends to whom, how many units, the link's RTT),
iteration, loss and throughput, and the routing's cost next to the oracle's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
import uvloop
from rich.console import Console
from rich.table import Table


def short(peer_id: str) -> str:
    return "…" + peer_id[-6:] if len(peer_id) > 8 else peer_id


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(summary: dict[str, Any], console: Console) -> None:
    flow, spec = summary["flow"], summary["spec"]
    console.print(f"[bold]run {summary['run_id']}[/]  {spec['model_family']}-{spec['model_preset']}"
                  f"  {spec['n_stages']} stages  iteration {summary['iteration']}  loss "
                  f"{_fmt(summary['loss'], 4)}  {summary['tokens_per_s']:.0f} tok/s  replicas in sync: "
                  f"{'yes' if summary['replicas_in_sync'] else 'NO'}")
    console.print(f"flow: {flow['units']} units, cost {_fmt(flow['cost_s'], 4)} s  (oracle: {flow['oracle_units']} "
                  f"units, {_fmt(flow['oracle_cost_s'], 4)} s)")
    if summary["unserved_stages"]:
        console.print(f"[red]no replica serves stage(s) {summary['unserved_stages']}: the swarm waits[/]")
    stages = Table("stage", "replicas", "capacity", "compute ms", "hashes", "in sync", title="stages")
    for s in summary["stages"]:
        stages.add_row(str(s["stage"]), " ".join(short(p) for p in s["replicas"]), str(s["capacity"]),
                       " ".join(f"{c:.1f}" for c in s["compute_ms"]),
                       " ".join(sorted(set(s["hashes"].values()))), "yes" if s["in_sync"] else "NO")
    console.print(stages)
    nodes = Table("peer", "role", "stage", "state", "iter", "cap", "ms", "location", "hash", "units",
                  title="nodes (ms: compute per microbatch; units: flow units sent on)")
    for n in summary["nodes"]:
        nodes.add_row(short(n["peer_id"]), n["role"], str(n["stage"]), n["state"], str(n["iteration"]),
                      str(n["capacity"]), f"{n['compute_ms']:.1f}", n["location"] or "-", n["hash"] or "-",
                      str(n["units_out"]))
    console.print(nodes)
    routing = Table("from", "to", "sink", "units", "RTT ms", title="routing (who sends to whom)")
    for r in summary["routing"]:
        routing.add_row(short(r["from"]), short(r["to"]), short(r["sink"]), str(r["units"]), _fmt(r["rtt_ms"], 1))
    console.print(routing)


async def _read(peers: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
    from gwtfp2p.daemon.status import read_swarm, summarize

    return summarize(await read_swarm(peers, timeout_s))


def status(
    initial_peers: list[str] = typer.Option(..., "--initial-peers", help="multiaddr(s) of any running peer"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of tables"),
    timeout_s: float = typer.Option(30.0, help="seconds to wait for the DHT"),
) -> None:
    """Show the swarm: stages, replicas, routing, iteration, loss, throughput, replica hashes."""
    from gwtfp2p.config import ConfigError
    from gwtfp2p.daemon.status import NoRunError
    from gwtfp2p.dht import DHTError

    peers = tuple(p.strip() for value in initial_peers for p in value.split(",") if p.strip())
    try:
        summary = uvloop.run(_read(peers, timeout_s))
    except (DHTError, NoRunError, ConfigError) as e:
        print(f"gwtf status: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(summary, default=str))
    else:
        render(summary, Console())
