"""``gwtf demo``: a whole swarm on this machine, training a small model on the embedded corpus.

Starts the bootstrap data holder and relays (``--stage auto``) as separate ``gwtf join`` processes
on 127.0.0.1 (own process groups, dying with the demo), shows the loss per iteration, then the
swarm as ``gwtf status`` sees it, and stops everything. ``--json`` prints one JSON object at the
end (iterations, losses, replicas_in_sync, tokens_per_s, the nodes and the final status). ``--churn``
crashes relays while it trains and replaces them (``chaos.py``) and adds the crash figures.
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

from gwtf_cli.chaos import CHAOS_FIELDS, ChaosDriver, chaos_summary, crash_env, describe_chaos
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
    def __init__(self, swarm: Swarm, say, geo: bool = False, link_scale: float = 0.2) -> None:
        self.swarm = swarm
        self.say = say
        self.geo = geo
        self.link_scale = link_scale
        self.env_for = lambda _name: None  # extra environment of a relay (the chaos driver's crash file)
        self.relay_args: tuple[str, ...] = ()

    def where(self, i: int) -> tuple[str, ...]:
        location = "Frankfurt" if i < 0 else GEO_RELAYS[i % len(GEO_RELAYS)]
        return ("--location", location, "--link-scale", str(self.link_scale)) if self.geo else ()

    def spawn_relay(self, name: str, i: int) -> Daemon:
        return self.swarm.spawn_relay(name, "auto", *self.relay_args, *self.where(i), env=self.env_for(name))

    def start(self, spec_path: str, iterations: int, n_relays: int, capacity: int) -> Daemon:
        self.relay_args = ("--capacity", str(capacity))
        dh = self.swarm.start("dh0", "--role", "data", "--run-spec", spec_path, "--max-iterations", str(iterations),
                              "--min-nodes", str(1 + n_relays), *self.where(-1))
        self.say(f"data holder {dh.peer_id[-6:]} up (run {dh.ready['run_id']}); bootstrap {dh.maddr}")
        relays = []
        for i in range(n_relays):  # each joiner places itself once the previous one's choice is in the DHT
            relays.append(self.spawn_relay(f"relay{i}", i))
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
    churn: float = typer.Option(0.0, "--churn", help="crashes per iteration: relays are SIGKILLed at random "
                                "moments (or mid-forward/backward/aggregation) and replaced (docs/churn.md)"),
    chaos_seed: int = typer.Option(0, "--chaos-seed", help="seed of the crashes' victims, moments and kinds"),
    kill_last: bool = typer.Option(False, "--kill-last", help="with --churn: the last replica of a stage may "
                                   "crash too (the swarm then waits for its replacement)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end instead of progress"),
    keep_logs: bool = typer.Option(False, help="keep the daemons' logs (their directory is printed)"),
) -> None:
    """Run a local swarm (one data holder, relays) and train a small model on the embedded corpus."""
    def say(line: str) -> None:
        if not as_json:
            print(line, flush=True)

    if churn < 0:
        print("gwtf demo: --churn: crashes per iteration must be >= 0 (e.g. 0.34: one crash every 3 iterations)",
              file=sys.stderr)
        raise typer.Exit(2)
    started = time.time()
    log_dir = Path(tempfile.mkdtemp(prefix="gwtf-demo-"))
    swarm = Swarm(log_dir, common=FAST)
    demo_run = Demo(swarm, say, geo, link_scale)
    chaos = None
    try:
        capacity = max(1, -(-DEMO_MICROBATCHES // relays_per_stage))  # a stage needs all its relays
        if churn > 0:
            demo_run.env_for = lambda name: crash_env(log_dir, name)
        dh = demo_run.start(_spec_file(log_dir, family, stages, lr), iterations, stages * relays_per_stage, capacity)
        startup_s = time.time() - started
        if churn > 0:
            chaos = _start_chaos(demo_run, dh, churn, chaos_seed, iterations, kill_last, log_dir)
        events = demo_run.follow(dh, iterations)
        if chaos is not None:
            chaos.stop()
        summary = _final_status(dh.maddr)
    except (TimeoutError, RuntimeError) as e:
        print(f"gwtf demo: {e}\n(logs in {log_dir})", file=sys.stderr)
        keep_logs = True
        raise typer.Exit(1) from None
    finally:
        if chaos is not None:
            chaos.stop()
        swarm.close()
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    figures = chaos_summary(chaos, [dh], swarm.daemons, stages, DEMO_MICROBATCHES, len(events)) if chaos else None
    _report(events, summary, swarm.daemons, startup_s, time.time() - started, as_json, say, figures)


def _start_chaos(demo_run: Demo, dh: Daemon, churn: float, seed: int, iterations: int, kill_last: bool,
                 log_dir: Path) -> ChaosDriver:
    relays = lambda: [d for d in demo_run.swarm.daemons if d is not dh]  # noqa: E731
    counter = iter(range(len(relays()), 10**6))
    chaos = ChaosDriver(dh, relays, lambda name: demo_run.spawn_relay(name, next(counter)), churn, seed, log_dir,
                        iterations, kill_last)
    chaos.say = demo_run.say
    demo_run.say(f"chaos: {churn} crashes per iteration (seed {seed}); every crash starts a replacement relay")
    return chaos.start()


def _final_status(maddr: str) -> dict[str, Any]:
    from gwtfp2p.daemon.status import read_swarm, summarize

    return summarize(uvloop.run(read_swarm((maddr,))))


def _report(events: list[dict[str, Any]], summary: dict[str, Any], daemons: list[Daemon], startup_s: float,
            wall_s: float, as_json: bool, say, chaos: dict[str, Any] | None = None) -> None:
    losses = [e["loss"] for e in events]
    seconds = sum(e["seconds"] for e in events)
    result = {"iterations": len(events), "losses": losses, "replicas_in_sync": in_sync(daemons),
              "tokens_per_s": sum(e["tokens"] for e in events) / seconds if seconds else 0.0,
              "startup_s": startup_s, "wall_s": wall_s,
              "nodes": [{"name": d.name, "peer_id": d.peer_id, "stage": d.ready["stage"],
                         "reason": d.ready["stage_reason"]} for d in daemons if d.ready],
              "status": summary}
    if chaos is not None:
        result.update({k: chaos[k] for k in CHAOS_FIELDS}, churn=chaos)
    if as_json:
        print(json.dumps(result, default=str))
        return
    from rich.console import Console

    from gwtf_cli.status_cmd import render

    render(summary, Console())
    trend = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no iteration"
    say(f"loss {trend} over {len(events)} iterations; {result['tokens_per_s']:.0f} tok/s; replicas in sync: "
        f"{'yes' if result['replicas_in_sync'] else 'NO'}; {wall_s:.0f} s in all ({startup_s:.0f} s to start)")
    if chaos is not None:
        for line in describe_chaos(chaos):
            say(line)
