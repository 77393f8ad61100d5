"""Benchmark: seeded chaos runs of a local swarm: relays SIGKILLed while it trains, replacements join.

Each run (``gwtfp2p.localswarm.chaos_run``) starts a fresh swarm of real ``gwtf join`` daemons (default: a
data holder + 2 stages × 4 relays = 9 processes, GPT-2 tiny, geo10 link emulation), trains a fixed
number of iterations while a seeded ``ChaosDriver`` crashes relays (random moments and crash
points mid-forward, mid-backward, mid-aggregation) and starts replacements (``--stage auto``), all
within a hard time limit. Per run it checks: no microbatch of a live data holder lost (each loss
recorded once), replica hashes agree after every step, each microbatch counted at most once per
part, the loss goes down, the run ended in its limit; and it measures extra time and recomputed
hops per crash. It prints a table per run and a summary; it measures, it does not assert times.

    python benchmarks/bench_chaos.py                       # 30 runs (docs/churn.md)
    python benchmarks/bench_chaos.py --runs 2 --iterations 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.localswarm.chaos_figures import mean, p95
from gwtfp2p.localswarm.chaos_run import ChaosSetup, run_chaos

COLUMNS = ("seed", "ok", "crashes", "joins", "lost", "in sync", "hops/crash", "hops/mb", "extra s mean", "extra s p95",
           "mb extra s", "loss", "wall s")


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def row(result: dict) -> tuple[str, ...]:
    loss = f"{_f(result.get('loss_first'))}->{_f(result.get('loss_last'))}"
    return (str(result["seed"]), "yes" if result["ok"] else "NO", str(result.get("crashes", 0)),
            str(result.get("joins", 0)), str(result.get("lost_microbatches", "-")),
            "yes" if result.get("replicas_in_sync") else "NO", _f(result.get("recomputed_hops_per_crash")),
            _f(result.get("recomputed_hops_per_affected_microbatch")), _f(result.get("extra_s_per_crash_mean")),
            _f(result.get("extra_s_per_crash_p95")), _f(result.get("recovery_extra_s_mean")), loss,
            _f(result["wall_s"], 0))


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    print("  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)), flush=True)


def by_mode(crashes: list[dict]) -> dict[str, dict]:
    """Per crash kind: crashes, those that hit microbatches in flight, extra time, recomputed hops."""
    table = {}
    for mode in ("random", "forward", "backward", "aggregation"):
        mine = [c for c in crashes if c["mode"] == mode]
        extras = [c["extra_s"] for c in mine if c["extra_s"] is not None]
        affected = sum(c["affected_microbatches"] for c in mine)
        table[mode] = {"crashes": len(mine), "hit_microbatches": sum(1 for c in mine if c["affected_microbatches"]),
                       "affected_microbatches": affected, "recomputed_hops": sum(c["recomputed_hops"] for c in mine),
                       "extra_s_mean": mean(extras), "extra_s_p95": p95(extras),
                       "point_reached": sum(1 for c in mine if c["how"] in ("crash point", "killed"))}
    return table


def summarize(results: list[dict]) -> dict:
    """Figures over all runs; per-crash figures pool every crash of every run."""
    crashes = [c for r in results for c in r.get("per_crash", [])]
    extras = [c["extra_s"] for c in crashes if c["extra_s"] is not None]
    mb_extras = [c["recovery_extra_s"] for c in crashes if c["affected_microbatches"]]
    detects = [c["detect_s"] for c in crashes if c.get("detect_s") is not None]
    affected = sum(c["affected_microbatches"] for c in crashes)
    hops = sum(r.get("recomputed_hops", 0) for r in results)
    attributed_hops = sum(c["recomputed_hops"] for c in crashes)
    return {
        "runs": len(results), "passed": sum(r["ok"] for r in results),
        "in_time": sum(not any("time limit" in v for v in r["violations"]) for r in results),
        "iterations": sum(r.get("iterations", 0) for r in results), "crashes": len(crashes),
        "by_mode": by_mode(crashes),
        "crashes_hitting_microbatches": sum(1 for c in crashes if c["affected_microbatches"]),
        "joins": sum(r.get("joins", 0) for r in results), "deferred_crashes": sum(r.get("deferred_crashes", 0)
                                                                                  for r in results),
        "lost_microbatches": sum(r.get("lost_microbatches", 0) for r in results),
        "runs_in_sync": sum(bool(r.get("replicas_in_sync")) for r in results),
        "runs_loss_down": sum(bool(r.get("loss_down")) for r in results),
        "recomputed_hops": hops, "affected_microbatches": affected,
        "recomputed_hops_per_crash": hops / len(crashes) if crashes else None,
        "recomputed_hops_per_affected_microbatch": attributed_hops / affected if affected else None,
        "max_recomputed_hops_per_microbatch": max((r.get("max_recomputed_hops", 0) for r in results), default=0),
        "unattributed_resends": sum(r.get("unattributed_resends", 0) for r in results),
        "extra_s_per_crash_mean": mean(extras), "extra_s_per_crash_p95": p95(extras),
        "extra_s_per_crash_median": statistics.median(extras) if extras else None,
        "microbatch_extra_s_mean": mean(mb_extras), "microbatch_extra_s_p95": p95(mb_extras),
        "detect_s_mean": mean(detects), "detect_s_p95": p95(detects),
        "clean_iteration_s_median": statistics.median([r["clean_iteration_s"] for r in results
                                                       if r.get("clean_iteration_s")] or [0.0]),
        "dying_steps": sum(r.get("dying_steps", 0) for r in results),
        "dying_steps_diverged": sum(r.get("dying_steps_diverged", 0) for r in results),
        "contributions_lost_with_dead_replicas": sum(r.get("contributions_lost_with_dead_replicas", 0)
                                                     for r in results),
        "loss_first_mean": mean([r["loss_first"] for r in results if r.get("loss_first") is not None]),
        "loss_last_mean": mean([r["loss_last"] for r in results if r.get("loss_last") is not None]),
        "wall_s_mean": mean([r["wall_s"] for r in results]), "wall_s_max": max(r["wall_s"] for r in results),
        "startup_s_mean": mean([r["startup_s"] for r in results if r.get("startup_s")]),
        "train_s_mean": mean([r["train_s"] for r in results if r.get("train_s")]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="run i uses seed + i")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.34, help="crashes per iteration")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--relays-per-stage", type=int, default=4)
    parser.add_argument("--data-holders", type=int, default=1)
    parser.add_argument("--link-scale", type=float, default=1.0, help="geo10 link emulation scale (0: plain loopback)")
    parser.add_argument("--limit-s", type=float, default=300.0, help="hard time limit of one run")
    parser.add_argument("--json", default="", help="write every run's result and the summary to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep every run's logs (failed runs' are always kept)")
    parser.add_argument("--work-dir", default="", help="put the runs' directories here (default: a temporary one)")
    args = parser.parse_args()
    results, rows = [], []
    started = time.time()
    for i in range(args.runs):
        setup = ChaosSetup(iterations=args.iterations, rate=args.rate, seed=args.seed + i, stages=args.stages,
                           relays_per_stage=args.relays_per_stage, data_holders=args.data_holders,
                           link_scale=args.link_scale, limit_s=args.limit_s)
        if args.work_dir:
            Path(args.work_dir).mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"gwtf-chaos-{setup.seed}-", dir=args.work_dir or None))
        result = run_chaos(setup, work)
        (work / "result.json").write_text(json.dumps(result, default=str, indent=1))
        if result["ok"] and not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
        else:
            result["logs"] = str(work)
        results.append(result)
        rows.append(row(result))
        print(f"\nrun {i + 1}/{args.runs} (seed {setup.seed}): {'passed' if result['ok'] else 'FAILED'} "
              f"in {result['wall_s']:.0f} s; {len(results)} runs in {time.time() - started:.0f} s", flush=True)
        for violation in result["violations"]:
            print(f"  violation: {violation}", flush=True)
        print_table(rows)
    summary = summarize(results)
    print("\nSUMMARY " + json.dumps(summary, default=str), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, default=str, indent=1))


if __name__ == "__main__":
    main()
