"""``gwtf demo``: a whole swarm on this machine, training a small model on the embedded corpus.

Starts the bootstrap data holder and relays (``--stage auto``) as separate ``gwtf join`` processes
on 127.0.0.1 (own process groups, dying with the demo), shows the loss per iteration, then the
swarm as ``gwtf status`` sees it, and stops everything. ``--json`` prints one JSON object at the
end (iterations, losses, replicas_in_sync, tokens_per_s, the nodes and the final status).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
import uvloop

from gwtf_cli.local_swarm import FAST, READY_TIMEOUT_S, Daemon, Swarm

GEO_RELAYS = ("London", "Tokyo", "Ireland", "Sydney", "Virginia", "Singapore", "Oregon", "Seoul")
ITERATION_TIMEOUT_S = 120.0
DEMO_MICROBATCHES = 4  # DEMO_SPEC.microbatches_per_dh (not imported here: the CLI starts fast)


def in_sync(daemons: list[Daemon]) -> bool:
    """Every part's replicas reported one state hash after every step they took together."""
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    for daemon in daemons:
        for event in daemon.of("step"):
            hashes[(event["stage"], event["iteration"])].add(event["hash"])
        for event in daemon.of("iteration"):
            hashes[(0, event["iteration"])].add(event["hash"])
    return bool(hashes) and all(len(v) == 1 for v in hashes.values())


def _spec_file(directory: Path, family: str, stages: int, lr: float) -> str:
    from gwtfp2p.daemon.spec_source import DEMO_SPEC

    spec = dataclasses.replace(DEMO_SPEC, model_family=family, n_stages=stages, lr=lr)
    path = directory / "run_spec.json"
    path.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(spec).items()}))
    return str(path)


class Demo:
    def __init__(self, swarm: Swarm, say) -> None:
        self.swarm = swarm
        self.say = say

    def start(self, spec_path: str, iterations: int, n_relays: int, capacity: int, geo: bool,
              link_scale: float) -> Daemon:
        def where(i: int) -> tuple[str, ...]:
            location = "Frankfurt" if i < 0 else GEO_RELAYS[i % len(GEO_RELAYS)]
            return ("--location", location, "--link-scale", str(link_scale)) if geo else ()

        dh = self.swarm.start("dh0", "--role", "data", "--run-spec", spec_path, "--max-iterations", str(iterations),
                              "--min-nodes", str(1 + n_relays), *where(-1))
        self.say(f"data holder {dh.peer_id[-6:]} up (run {dh.ready['run_id']}); bootstrap {dh.maddr}")
        relays = []
        for i in range(n_relays):  # each joiner places itself once the previous one's choice is in the DHT
            relays.append(self.swarm.spawn_relay(f"relay{i}", "auto", "--capacity", str(capacity), *where(i)))
            relays[-1].wait_event("placed", READY_TIMEOUT_S)
        for relay in relays:
            relay.wait_ready()
            self.say(f"relay {relay.peer_id[-6:]} joined stage {relay.ready['stage']}: {relay.ready['stage_reason']}")
        return dh

    def follow(self, dh: Daemon, iterations: int) -> list[dict[str, Any]]:
        events, cursor, since = [], 0, time.time()
        while len(events) < iterations:
            event, cursor = dh.next_event(("iteration", "waiting", "training_done"), cursor, ITERATION_TIMEOUT_S)
            if event["event"] == "training_done":
                break
            if event["event"] == "waiting" and event["time"] >= since:
                self.say(f"  waiting: {event['reason']}")
            if event["event"] == "waiting":
                continue
            events.append(event)
            self.say(f"iteration {event['iteration']:>3}  loss {event['loss']:.4f}  {event['tokens_per_s']:7.0f} tok/s"
                     f"  {event['units']} flow unit(s)  {event['seconds'] * 1000:.0f} ms")
        return events


def demo(
    iterations: int = typer.Option(40, help="training iterations"),
    stages: int = typer.Option(2, help="pipeline stages of the model"),
    relays_per_stage: int = typer.Option(2, help="relays per stage (placed with --stage auto)"),
    family: str = typer.Option("gpt2", help="gpt2 or llama (tiny preset, byte tokenizer)"),
    lr: float = typer.Option(3e-3, help="learning rate"),
    geo: bool = typer.Option(False, help="emulate geo10 links: data holder in Frankfurt, relays around the world"),
    link_scale: float = typer.Option(0.2, help="scale of the emulated link delays with --geo"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end instead of progress"),
    keep_logs: bool = typer.Option(False, help="keep the daemons' logs (their directory is printed)"),
) -> None:
    """Run a local swarm (one data holder, relays) and train a small model on the embedded corpus."""
    def say(line: str) -> None:
        if not as_json:
            print(line, flush=True)

    started = time.time()
    log_dir = Path(tempfile.mkdtemp(prefix="gwtf-demo-"))
    swarm = Swarm(log_dir, common=FAST)
    demo_run = Demo(swarm, say)
    try:
        capacity = max(1, -(-DEMO_MICROBATCHES // relays_per_stage))  # a stage needs all its relays
        dh = demo_run.start(_spec_file(log_dir, family, stages, lr), iterations, stages * relays_per_stage, capacity,
                            geo, link_scale)
        startup_s = time.time() - started
        events = demo_run.follow(dh, iterations)
        summary = _final_status(dh.maddr)
    except (TimeoutError, RuntimeError) as e:
        print(f"gwtf demo: {e}\n(logs in {log_dir})", file=sys.stderr)
        keep_logs = True
        raise typer.Exit(1) from None
    finally:
        swarm.close()
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    _report(events, summary, swarm.daemons, startup_s, time.time() - started, as_json, say)


def _final_status(maddr: str) -> dict[str, Any]:
    from gwtfp2p.daemon.status import read_swarm, summarize

    return summarize(uvloop.run(read_swarm((maddr,))))


def _report(events: list[dict[str, Any]], summary: dict[str, Any], daemons: list[Daemon], startup_s: float,
            wall_s: float, as_json: bool, say) -> None:
    losses = [e["loss"] for e in events]
    seconds = sum(e["seconds"] for e in events)
    result = {"iterations": len(events), "losses": losses, "replicas_in_sync": in_sync(daemons),
              "tokens_per_s": sum(e["tokens"] for e in events) / seconds if seconds else 0.0,
              "startup_s": startup_s, "wall_s": wall_s,
              "nodes": [{"name": d.name, "peer_id": d.peer_id, "stage": d.ready["stage"],
                         "reason": d.ready["stage_reason"]} for d in daemons if d.ready],
              "status": summary}
    if as_json:
        print(json.dumps(result, default=str))
        return
    from rich.console import Console

    from gwtf_cli.status_cmd import render

    render(summary, Console())
    trend = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no iteration"
    say(f"loss {trend} over {len(events)} iterations; {result['tokens_per_s']:.0f} tok/s; replicas in sync: "
        f"{'yes' if result['replicas_in_sync'] else 'NO'}; {wall_s:.0f} s in all ({startup_s:.0f} s to start)")
