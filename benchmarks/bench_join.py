"""Benchmark: a relay joining a running swarm, time to its first useful microbatch against its stage's state size.

Per case, one swarm (1 data holder, 1 relay per stage, 2 stages; stage 1's relay is the bottleneck,
so a newcomer of stage 1 attracts flow) trains a few iterations; then newcomers of stage 1 join one
after the other (each leaves gracefully before the next). For each join, from its events: state bytes
(weights + AdamW state), and the time from process start split into imports, DHT + run spec +
transport + placement, model build, state download (fetch + verify + load) and handshake, the wait
for the iteration it first gets flow in, and that iteration's first microbatch (its first finished
backward). A join that fails is reported with its downloads against the iteration time (a joiner must
download, load and announce itself within one iteration, else it downloads again, 4 tries). It
measures; it asserts no wall time. Cases (GPT-2, byte vocabulary): tiny and small, 2 + 2 and 3 + 3
layers; 124m-l1: stage 1 holds 1 of 124m's 12 layers; 124m: 6 of 12, with 16 microbatches per
iteration so that an iteration lasts about as long as the state download.

    python benchmarks/bench_join.py                      # tiny, small, 124m-l1, 124m; 3 joins each
    python benchmarks/bench_join.py --cases tiny,small --joins 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.localswarm.processes import FAST, Daemon, Swarm

MIB = 2**20
START_TIMEOUT_S = 240.0  # process start -> ready, 124m on two busy cores included
USEFUL_TIMEOUT_S = 240.0
EXIT_TIMEOUT_S = 30.0
COMMON = (*FAST, "--torch-threads", "1", "--log-level", "INFO")


@dataclass(frozen=True)
class Case:
    name: str
    preset: str
    partition: tuple[int, ...]  # decoder layers per stage; stage 1 is the newcomer's
    seq_len: int
    microbatch_size: int = 1
    microbatches_per_dh: int = 4
    warmup_iterations: int = 3

    def spec(self) -> RunSpec:
        return RunSpec(model_family="gpt2", model_preset=self.preset, n_stages=2, partition=self.partition,
                       seed=0, microbatch_size=self.microbatch_size, seq_len=self.seq_len,
                       microbatches_per_dh=self.microbatches_per_dh)


CASES = {c.name: c for c in (Case("tiny", "tiny", (2, 2), 64, 2), Case("small", "small", (3, 3), 64, 2),
                             Case("124m-l1", "124m", (1, 11), 32), Case("124m", "124m", (6, 6), 32, 1, 16, 1))}


def start_swarm(case: Case, work: Path) -> tuple[Swarm, Daemon, Daemon]:
    """Data holder + stage-1 relay (capacity 2 < microbatches: the bottleneck) + stage-2 relay, trained a little."""
    spec = case.spec()
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({f.name: getattr(spec, f.name) for f in fields(spec)}))
    swarm = Swarm(work, common=COMMON)
    dh = swarm.start("dh0", "--role", "data", "--run-spec", str(spec_path), "--min-nodes", "3",
                     wait_ready_s=START_TIMEOUT_S)
    r1 = swarm.spawn_relay("r1", "1", "--capacity", "2")
    r2 = swarm.spawn_relay("r2", "2", "--capacity", "8")
    for relay in (r1, r2):
        relay.wait_ready(START_TIMEOUT_S)
    dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= case.warmup_iterations - 1,
                START_TIMEOUT_S, "warm-up iterations")
    return swarm, dh, r1


def measure_join(swarm: Swarm, dh: Daemon, r1: Daemon, name: str) -> dict:
    """Spawn a stage-1 newcomer, wait for its first useful microbatch and that iteration's step."""
    load_before = os.getloadavg()[0]
    newcomer = swarm.spawn_relay(name, "1", "--capacity", "2")
    try:
        ready = newcomer.wait_ready(START_TIMEOUT_S).ready
        useful = newcomer.wait_event("first_microbatch", USEFUL_TIMEOUT_S)
        t = useful["iteration"]
        closed = dh.wait_event("iteration", USEFUL_TIMEOUT_S, iteration=t)
        mine = newcomer.wait_event("step", USEFUL_TIMEOUT_S, iteration=t)
        theirs = r1.wait_event("step", USEFUL_TIMEOUT_S, iteration=t)
    except (RuntimeError, TimeoutError) as e:  # a join that failed is a result too
        return failed_join(newcomer, dh, str(e))
    waited = [e["seconds"] for e in dh.of("iteration") if ready["from_iteration"] <= e["iteration"] <= t]
    return {"name": name, **phases(newcomer, ready, useful, closed), "state_bytes": ready["state_bytes"],
            "state_source": ready["state_source"], "from_iteration": ready["from_iteration"],
            "first_useful_iteration": t, "downloads": len(newcomer.of("downloading")),
            "iteration_s": statistics.median(waited), "hash_ok": mine["hash"] == theirs["hash"],
            "load_avg_1m": round(max(load_before, os.getloadavg()[0]), 1)}


LOADED = re.compile(r"loaded stage \d+ state of iteration (\d+) .* (\d+) bytes in ([\d.]+) s")


def failed_join(newcomer: Daemon, dh: Daemon, error: str) -> dict:
    """What a failed join did: its downloads (from its INFO log) against the iterations meanwhile."""
    loaded = LOADED.findall(newcomer.stderr_path.read_text(errors="replace")) if newcomer.stderr_path.exists() else []
    meanwhile = [e["seconds"] for e in dh.of("iteration") if e["time"] > newcomer.started_at]
    return {"name": newcomer.name, "failed": error.splitlines()[-1] if error else "?",
            "state_bytes": int(loaded[-1][1]) if loaded else 0,
            "download_s": [float(s) for _, _, s in loaded], "state_iterations": [int(i) for i, _, _ in loaded],
            "iteration_s": statistics.median(meanwhile) if meanwhile else None,
            "load_avg_1m": round(os.getloadavg()[0], 1)}


def phases(newcomer: Daemon, ready: dict, useful: dict, closed: dict) -> dict[str, float]:
    """Seconds of each phase from the newcomer's events and the data holder's iteration that gave it work."""
    spawned, pid_started = newcomer.started_at, ready["pid_started_at"]
    placed, downloading = newcomer.of("placed")[0], newcomer.of("downloading")
    download_from = downloading[0]["time"] if downloading else ready["time"]
    boundary = max(ready["time"], closed["time"] - closed["seconds"])  # the data holder started iteration t
    return {"imports_s": pid_started - spawned, "dht_place_s": placed["time"] - pid_started,
            "model_s": download_from - placed["time"], "download_s": ready["download_s"],
            "join_s": ready["time"] - download_from, "boundary_wait_s": boundary - ready["time"],
            "first_mb_s": useful["time"] - boundary, "start_to_ready_s": ready["time"] - spawned,
            "ready_to_useful_s": useful["time"] - ready["time"], "start_to_useful_s": useful["time"] - spawned}


def leave(newcomer: Daemon, dh: Daemon) -> None:
    """SIGTERM (graceful leave), then let the swarm close two iterations without it."""
    newcomer.terminate()
    try:
        newcomer.popen.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        newcomer.kill_group()
    gone = time.time()
    dh.wait_for(lambda e: e.get("event") == "iteration" and e["time"] > gone, USEFUL_TIMEOUT_S, "an iteration")
    last = dh.of("iteration")[-1]["iteration"]
    dh.wait_event("iteration", USEFUL_TIMEOUT_S, iteration=last + 1)


def run_case(case: Case, joins: int, log_dir: str) -> list[dict]:
    if log_dir:
        (Path(log_dir) / case.name).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        work = Path(log_dir) / case.name if log_dir else Path(tmp)
        swarm, dh, r1 = start_swarm(case, work)
        try:
            results = []
            for j in range(joins):
                results.append(measure_join(swarm, dh, r1, f"n{j}"))
                print(f"  {case.name} join {j + 1}/{joins}: {fmt_row(results[-1])}", file=sys.stderr, flush=True)
                if j + 1 < joins:
                    leave(swarm.daemons[-1], dh)
            return results
        finally:
            swarm.close()
            if log_dir:
                for daemon in swarm.daemons:
                    lines = "".join(json.dumps(e) + "\n" for e in daemon.events)
                    (work / f"{daemon.name}.events.jsonl").write_text(lines)


def fmt_row(r: dict) -> str:
    if "failed" in r:
        return (f"FAILED ({r['failed']}): state {r['state_bytes'] / MIB:.2f} MiB, downloads of "
                f"{r['download_s']} s (state iterations {r['state_iterations']}), iterations meanwhile "
                f"{r['iteration_s']} s (median)")
    return (f"state {r['state_bytes'] / MIB:.2f} MiB, download {r['download_s']:.2f} s, start->ready "
            f"{r['start_to_ready_s']:.1f} s, ready->useful {r['ready_to_useful_s']:.1f} s, iterations "
            f"{r['from_iteration']}->{r['first_useful_iteration']}, hash ok {r['hash_ok']}")


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def span(rows: list[dict], key: str, digits: int = 1) -> str:
    values = sorted(r[key] for r in rows)
    med = f"{statistics.median(values):.{digits}f}"
    return med if len(values) == 1 else f"{med} ({values[0]:.{digits}f}–{values[-1]:.{digits}f})"


def table(head: tuple[str, ...], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def report(results: dict[str, list[dict]]) -> None:
    ok = {name: [r for r in rows if "failed" not in r] for name, rows in results.items()}
    print("\nmedian (min–max) seconds per join; the phases add up to process start -> first useful microbatch")
    head = ("case", "joins ok", "state MiB", "imports", "DHT+place", "model", "download", "join (dl+hs)",
            "flow+boundary wait", "first mb", "start->ready", "ready->useful", "start->useful", "iteration s",
            "entered->useful iteration", "hash = r1's", "load 1 min")
    lines = []
    for name, rows in ok.items():
        if not rows:
            lines.append([name, f"0/{len(results[name])}", *["-"] * (len(head) - 2)])
            continue
        iters = ", ".join(f"{r['from_iteration']}->{r['first_useful_iteration']}" for r in rows)
        lines.append([name, f"{len(rows)}/{len(results[name])}", f"{median(rows, 'state_bytes') / MIB:.2f}",
                      *(span(rows, k) for k in ("imports_s", "dht_place_s", "model_s")), span(rows, "download_s", 2),
                      *(span(rows, k) for k in ("join_s", "boundary_wait_s", "first_mb_s", "start_to_ready_s",
                                                "ready_to_useful_s", "start_to_useful_s")),
                      span(rows, "iteration_s", 2), iters, f"{sum(r['hash_ok'] for r in rows)}/{len(rows)}",
                      f"{min(r['load_avg_1m'] for r in rows)}–{max(r['load_avg_1m'] for r in rows)}"])
    table(head, lines)
    for name, rows in results.items():
        for r in rows:
            if "failed" in r:
                print(f"  {name} {r['name']}: {fmt_row(r)}")
    report_ratios({name: rows for name, rows in ok.items() if rows})


def report_ratios(results: dict[str, list[dict]]) -> None:
    if not results:
        return
    base_name = next(iter(results))
    base = results[base_name]
    print(f"\nside by side (medians; ratios against {base_name})")
    head = ("case", "state ×", "download ×", "start->useful ×", "download s/MiB", "join s/MiB", "download MiB/s",
            "share of start->useful: startup / join / flow+boundary / first mb")
    lines = []
    for name, rows in results.items():
        mib = median(rows, "state_bytes") / MIB
        total = median(rows, "start_to_useful_s")
        startup = sum(median(rows, k) for k in ("imports_s", "dht_place_s", "model_s"))
        shares = (startup, median(rows, "join_s"), median(rows, "boundary_wait_s"), median(rows, "first_mb_s"))
        lines.append([name, f"{median(rows, 'state_bytes') / median(base, 'state_bytes'):.0f}",
                      f"{median(rows, 'download_s') / median(base, 'download_s'):.1f}",
                      f"{total / median(base, 'start_to_useful_s'):.2f}",
                      f"{median(rows, 'download_s') / mib:.3f}", f"{median(rows, 'join_s') / mib:.3f}",
                      f"{mib / median(rows, 'download_s'):.1f}",
                      " / ".join(f"{100 * v / total:.0f} %" for v in shares)])
    table(head, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--joins", type=int, default=3, help="newcomers per case, one after the other")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--log-dir", default="", help="keep each daemon's stderr log here (default: a temporary dir)")
    parser.add_argument("--tables-of", default="", metavar="FILE", help="print the tables of a saved --json output")
    args = parser.parse_args()
    if args.tables_of:
        report(json.loads(Path(args.tables_of).read_text())["joins"])
        return
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown or args.joins < 1:
        parser.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}" if unknown else "--joins: >= 1")
    results = {}
    for name in names:
        print(f"{name}: starting the swarm", file=sys.stderr, flush=True)
        results[name] = run_case(CASES[name], args.joins, args.log_dir)
    if args.json:
        print(json.dumps({"cases": {n: asdict(CASES[n]) for n in names}, "joins": results}, indent=1))
    else:
        report(results)


if __name__ == "__main__":
    main()
