"""``gwtf demo``: a whole swarm on this machine, training a small model on the embedded corpus.

Starts the bootstrap data holder and relays (``--stage auto``) as separate ``gwtf join`` processes
on 127.0.0.1 (own process groups, dying with the demo), shows the loss per iteration, then the
swarm as ``gwtf status`` sees it, and stops everything. ``--json`` prints one JSON object at the
end (iterations, losses, replicas_in_sync, tokens_per_s, the wire codec and bytes per microbatch per
hop, the nodes and the final status). ``--churn`` crashes relays while it trains and replaces them
(``chaos.py``) and adds the crash figures. ``--codec`` sends activations, gradients and aggregation
contributions in a wire codec (docs/transport.md).
``--serve PORT`` serves the live status page of the swarm while it trains (``gwtf_cli.web``);
``--metrics-port-base P`` gives the nodes Prometheus endpoints on ports P, P+1, ... in start order.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
import uvloop

from gwtfp2p.config import WIRE_CODECS
from gwtfp2p.localswarm.chaos import CHAOS_FIELDS, ChaosDriver, chaos_summary, crash_env, describe_chaos
from gwtfp2p.localswarm.processes import FAST, READY_TIMEOUT_S, Daemon, Swarm
from gwtfp2p.localswarm.wire_figures import bytes_per_microbatch_hop, swarm_traffic

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


def _spec_file(directory: Path, family: str, stages: int, lr: float, codec: str) -> str:
    from gwtfp2p.daemon.lifecycle.run_spec import DEMO_SPEC

    # Every node is this command's own: no member to screen (an honest gradient spike would be screened out,
    # and the demo would not train as one process does; docs/security.md, "Robust aggregation").
    spec = dataclasses.replace(DEMO_SPEC, model_family=family, n_stages=stages, lr=lr, forward_codec=codec,
                               backward_codec=codec, aggregate_codec=codec, screen_factor=0.0)
    path = directory / "run_spec.json"
    path.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(spec).items()}))
    return str(path)


class StatusPage:
    """``--serve``: the live status page of the local swarm, read through one client-mode DHT."""

    def __init__(self, maddr: str, port: int) -> None:
        from gwtf_cli.web import serve_status
        from gwtf_cli.web.dht_reader import DHTReader

        self.reader = DHTReader.open((maddr,))  # in this thread, before the page's threads start
        try:
            self.handle = serve_status(self.reader, port)
        except OSError as e:
            self.reader.close()
            raise RuntimeError(f"--serve {port}: cannot listen on 127.0.0.1:{port} ({e.strerror or e}); pick "
                               "another port") from None
        self.url = self.handle.url

    def close(self) -> None:
        if self.handle.close():  # else a read is still in progress: the DHT client goes with the process
            self.reader.close()


class Demo:
    def __init__(self, swarm: Swarm, say, geo: bool = False, link_scale: float = 0.2,
                 metrics_port_base: int | None = None, serve: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.swarm = swarm
        self.say = say
        self.geo = geo
        self.link_scale = link_scale
        self.env_for = lambda _name: None  # extra environment of a relay (the chaos driver's crash file)
        self.relay_args: tuple[str, ...] = ()
        self.metrics_ports: Iterator[int] | None = (None if metrics_port_base is None else
                                                    itertools.count(metrics_port_base))
        self.serve = serve  # --serve's port: the page opens once the data holder is up
        self.page: StatusPage | None = None
        self.clock = clock  # seconds, for the deadline of ``follow``

    def where(self, i: int) -> tuple[str, ...]:
        location = "Frankfurt" if i < 0 else GEO_RELAYS[i % len(GEO_RELAYS)]
        return ("--location", location, "--link-scale", str(self.link_scale)) if self.geo else ()

    def metrics(self) -> tuple[str, ...]:
        """``--metrics-port`` of the next node started (none without ``--metrics-port-base``)."""
        return () if self.metrics_ports is None else ("--metrics-port", str(next(self.metrics_ports)))

    def spawn_relay(self, name: str, i: int) -> Daemon:
        return self.swarm.spawn_relay(name, "auto", *self.relay_args, *self.where(i), *self.metrics(),
                                      env=self.env_for(name))

    def _joined(self, daemon: Daemon, line: str) -> None:
        port = daemon.ready.get("metrics_port")
        self.say(line + ("" if port is None else f"; metrics http://127.0.0.1:{port}/metrics"))

    def start(self, spec_path: str, iterations: int, n_relays: int, capacity: int) -> Daemon:
        self.relay_args = ("--capacity", str(capacity))
        dh = self.swarm.start("dh0", "--role", "data", "--run-spec", spec_path, "--max-iterations", str(iterations),
                              "--min-nodes", str(1 + n_relays), *self.where(-1), *self.metrics())
        self._joined(dh, f"data holder {dh.peer_id[-6:]} up (run {dh.ready['run_id']}); bootstrap {dh.maddr}")
        if self.serve is not None:
            self.page = StatusPage(dh.maddr, self.serve)
            self.say(f"status page: {self.page.url} (while the swarm trains)")
        relays = []
        for i in range(n_relays):  # each joiner places itself once the previous one's choice is in the DHT
            relays.append(self.spawn_relay(f"relay{i}", i))
            relays[-1].wait_event("placed", READY_TIMEOUT_S)
        for relay in relays:
            relay.wait_ready()
            self._joined(relay, f"relay {relay.peer_id[-6:]} joined stage {relay.ready['stage']}: "
                                f"{relay.ready['stage_reason']}")
        return dh

    def follow(self, dh: Daemon, iterations: int) -> list[dict[str, Any]]:
        """The data holder's iteration events until ``iterations`` (or its ``training_done``). TimeoutError
        when no iteration comes within ``ITERATION_TIMEOUT_S`` of the last one: the data holder's periodic
        *waiting* events are shown, but they do not extend the wait (a stuck swarm keeps sending them)."""
        events, cursor, since = [], 0, time.time()
        progress_at, waiting_for = self.clock(), ""
        while len(events) < iterations:
            remaining_s = ITERATION_TIMEOUT_S - (self.clock() - progress_at)
            if remaining_s <= 0:
                last = f"after iteration {events[-1]['iteration']}" if events else "before its first iteration"
                raise TimeoutError(f"the data holder completed no iteration within {ITERATION_TIMEOUT_S:.0f} s "
                                   f"{last}; it is waiting: {waiting_for or 'it did not say for what'}")
            event, cursor = dh.next_event(("iteration", "waiting", "training_done"), cursor, remaining_s)
            if event["event"] == "training_done":
                break
            if event["event"] == "waiting":
                waiting_for = event["reason"]
                if event["time"] >= since:
                    self.say(f"  waiting: {event['reason']}")
                continue
            events.append(event)
            progress_at = self.clock()
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
                                "moments (or mid-forward/backward/aggregation, or before sending their contribution) "
                                "and replaced (docs/churn.md)"),
    chaos_seed: int = typer.Option(0, "--chaos-seed", help="seed of the crashes' victims, moments and kinds"),
    kill_last: bool = typer.Option(False, "--kill-last", help="with --churn: the last replica of a stage may "
                                   "crash too (the swarm then waits for its replacement)"),
    serve: int = typer.Option(None, "--serve", help="serve the swarm's live status page on this port while it "
                              "trains (0: any free port; the URL is printed)", show_default=False),
    metrics_port_base: int = typer.Option(None, "--metrics-port-base", help="Prometheus metrics of the nodes on "
                                          "ports P, P+1, ... (data holder first, replacements after)",
                                          show_default=False),
    codec: str = typer.Option("none", "--codec", help="wire codec of activations, gradients and aggregation "
                              f"contributions: {', '.join(WIRE_CODECS)} (docs/transport.md)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object at the end instead of progress"),
    keep_logs: bool = typer.Option(False, help="keep the daemons' logs, at INFO level, and their events "
                                               "(NAME.events.jsonl); the directory is printed"),
) -> None:
    """Run a local swarm (one data holder, relays) and train a small model on the embedded corpus."""
    def say(line: str) -> None:
        if not as_json:
            print(line, flush=True)

    if churn < 0:
        print("gwtf demo: --churn: crashes per iteration must be >= 0 (e.g. 0.34: one crash every 3 iterations)",
              file=sys.stderr)
        raise typer.Exit(2)
    _check_ports(serve, metrics_port_base)
    if codec not in WIRE_CODECS:
        print(f"gwtf demo: --codec: must be one of {', '.join(WIRE_CODECS)}, got {codec!r}", file=sys.stderr)
        raise typer.Exit(2)
    started = time.time()
    log_dir = Path(tempfile.mkdtemp(prefix="gwtf-demo-"))
    swarm = Swarm(log_dir, common=(*FAST, "--log-level", "INFO") if keep_logs else FAST)  # kept logs: for reading
    demo_run = Demo(swarm, say, geo, link_scale, metrics_port_base, serve)
    chaos = None
    try:
        capacity = max(1, -(-DEMO_MICROBATCHES // relays_per_stage))  # a stage needs all its relays
        if churn > 0:
            demo_run.env_for = lambda name: crash_env(log_dir, name)
        dh = demo_run.start(_spec_file(log_dir, family, stages, lr, codec), iterations, stages * relays_per_stage,
                            capacity)
        startup_s = time.time() - started
        if churn > 0:
            chaos = _start_chaos(demo_run, dh, churn, chaos_seed, iterations, kill_last, log_dir)
        events = demo_run.follow(dh, iterations)
        if chaos is not None:
            chaos.stop()
        sent = swarm_traffic(swarm.daemons, time.time())
        summary = _final_status(dh.maddr)
    except (TimeoutError, RuntimeError) as e:
        print(f"gwtf demo: {e}", file=sys.stderr)  # the logs are kept, and their directory printed, below
        keep_logs = True
        raise typer.Exit(1) from None
    finally:
        if chaos is not None:
            chaos.stop()
        if demo_run.page is not None:
            demo_run.page.close()
        swarm.close()
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            swarm.save_events()
            print(f"gwtf demo: logs kept in {log_dir}", file=sys.stderr)  # stderr: --json's stdout stays one object
    figures = chaos_summary(chaos, [dh], swarm.daemons, stages, DEMO_MICROBATCHES, len(events)) if chaos else None
    wire = {"codec": codec, "bytes_per_microbatch_hop": bytes_per_microbatch_hop(sent), "traffic": sent}
    _report(events, summary, swarm.daemons, startup_s, time.time() - started, as_json, say, figures, wire)


def _check_ports(serve: int | None, metrics_port_base: int | None) -> None:
    if serve is not None and not 0 <= serve <= 65535:
        print(f"gwtf demo: --serve: a port within 0..65535 (0: any free one), got {serve}", file=sys.stderr)
        raise typer.Exit(2)
    if metrics_port_base is not None and not 1024 <= metrics_port_base <= 65000:
        print(f"gwtf demo: --metrics-port-base: a port within 1024..65000 (the nodes take it and the ones after "
              f"it), got {metrics_port_base}", file=sys.stderr)
        raise typer.Exit(2)


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
            wall_s: float, as_json: bool, say, chaos: dict[str, Any] | None = None,
            wire: dict[str, Any] | None = None) -> None:
    losses = [e["loss"] for e in events]
    seconds = sum(e["period_s"] for e in events)  # the pace: aggregation and steps too
    result = {"iterations": len(events), "losses": losses, "replicas_in_sync": in_sync(daemons),
              "tokens_per_s": sum(e["tokens"] for e in events) / seconds if seconds else 0.0,
              **(wire or {}), "startup_s": startup_s, "wall_s": wall_s,
              "nodes": [{"name": d.name, "peer_id": d.peer_id, "stage": d.ready["stage"],
                         "reason": d.ready["stage_reason"], "metrics_port": d.ready.get("metrics_port")}
                        for d in daemons if d.ready],
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
    if result.get("bytes_per_microbatch_hop") is not None:
        say(f"wire codec {result['codec']}: {result['bytes_per_microbatch_hop']:,.0f} bytes per microbatch per hop "
            "(forward + backward)")
    if chaos is not None:
        for line in describe_chaos(chaos):
            say(line)
