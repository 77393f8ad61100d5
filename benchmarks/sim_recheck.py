"""Re-run one router's grid runs at this commit and compare them, seed by seed, with the saved raw runs.

A change to the flow protocol moves the simulator's gwtf figures (the simulator runs the daemon's
``FlowNode``). Rather than a whole grid (hours), this re-runs the first ``--seeds`` seeds of every grid
cell for ``--router`` (gwtf by default), the same jobs ``bench_sim.py`` plans, and prints for each run the
time to N now and as saved (``docs/data/bench_sim.json``), their ratio, and now / the saved oracle and
SWARM of the same seed. Nothing is written to docs; ``--json`` keeps the rows.

    python benchmarks/sim_recheck.py --seeds 1 --workers 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_sim import build_jobs  # benchmarks/, beside this
from sim_runs import from_raw, run_all


def saved_times(raw_path: Path) -> dict[tuple[str, str, int], float]:
    """(scenario, router, seed) -> time to N of the saved runs."""
    runs = from_raw(json.loads(raw_path.read_text()))
    return {(r.summary.scenario, r.summary.router, r.summary.seed): r.summary.time_to_n_s for r, _, _ in runs}


def compare(new: list, saved: dict, router: str) -> list[dict]:
    rows = []
    for result, cpu_s, _ in sorted(new, key=lambda t: (t[0].summary.scenario, t[0].summary.seed)):
        s = result.summary
        key = (s.scenario, router, s.seed)
        before = saved.get(key)
        row = {"scenario": s.scenario, "seed": s.seed, "now_s": s.time_to_n_s, "saved_s": before, "cpu_s": cpu_s}
        for other in ("oracle", "swarm"):
            base = saved.get((s.scenario, other, s.seed))
            row[f"now_over_{other}"] = None if base is None or s.time_to_n_s is None else s.time_to_n_s / base
        row["now_over_saved"] = None if before is None or s.time_to_n_s is None else s.time_to_n_s / before
        rows.append(row)
    return rows


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--router", default="gwtf")
    parser.add_argument("--only", default="", help="only scenarios whose name contains this")
    parser.add_argument("--raw", type=Path, default=Path("docs/data/bench_sim.json"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    saved = saved_times(args.raw)
    jobs = [j for j in build_jobs(args.seeds, args.seeds, False, args.only) if j.router == args.router]
    new = run_all(jobs, args.workers, lambda _done: None)
    rows = compare(new, saved, args.router)
    print(f"{'scenario':40} seed  now_s     saved_s   now/saved now/oracle now/swarm")
    for r in rows:
        print(f"{r['scenario']:40} {r['seed']:4} {_fmt(r['now_s'], 0):>9} {_fmt(r['saved_s'], 0):>9} "
              f"{_fmt(r['now_over_saved']):>9} {_fmt(r['now_over_oracle']):>10} {_fmt(r['now_over_swarm']):>9}")
    ratios = [r["now_over_saved"] for r in rows if r["now_over_saved"] is not None]
    if ratios:
        print(f"now/saved: median {statistics.median(ratios):.4f}, worst {max(ratios):.4f}, best {min(ratios):.4f}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        args.json.write_text(json.dumps({"commit": commit, "router": args.router, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
