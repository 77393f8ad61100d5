"""Reports of simulated runs: per-router medians and spreads, markdown, CSV and JSON.

A cell is one (scenario, router) over its seeds: the median of each metric and its range. The
comparisons the paper makes are derived from the medians: gwtf's training-time reduction against
swarm, its throughput as a fraction of the oracle's, GPU time wasted per crash. Writing files is
the caller's business (the CLI, the benchmark); this module only builds text and dictionaries.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gwtfp2p.sim.simulation import RunResult

SUMMARY_FIELDS = ("time_to_n_s", "microbatches_per_s", "wasted_gpu_s", "crashes", "wasted_gpu_s_per_crash",
                  "median_iteration_s", "idle_fraction", "mean_path_cost_s", "recoveries", "completed",
                  "control_messages")
ROUTER_ORDER = ("gwtf", "swarm", "swarm-barrier", "oracle")


@dataclass(frozen=True)
class Spread:
    median: float | None
    low: float | None
    high: float | None
    n: int

    def text(self, digits: int = 0, unit: str = "") -> str:
        if self.median is None:
            return "—"
        fmt = f"{{:.{digits}f}}"
        core = fmt.format(self.median) + unit
        if self.n > 1 and self.low is not None and self.high is not None and self.low != self.high:
            core += f" ({fmt.format(self.low)}–{fmt.format(self.high)})"
        return core


def spread(values: Iterable[float | None]) -> Spread:
    """Median and range; a run that missed its target (None) counts as infinitely slow."""
    raw = list(values)
    if not raw:
        return Spread(None, None, None, 0)
    inf = float("inf")
    ordered = sorted(inf if v is None else float(v) for v in raw)
    median = statistics.median(ordered)
    return Spread(None if median == inf else median, None if ordered[0] == inf else ordered[0],
                  None if ordered[-1] == inf else ordered[-1], len(raw))


def group(results: Sequence[RunResult]) -> dict[str, dict[str, list[RunResult]]]:
    """scenario -> router -> runs (sorted by seed)."""
    cells: dict[str, dict[str, list[RunResult]]] = defaultdict(lambda: defaultdict(list))
    for result in sorted(results, key=lambda r: (r.summary.scenario, r.summary.router, r.summary.seed)):
        cells[result.summary.scenario][result.summary.router].append(result)
    return cells


def routers_of(cell: dict[str, list[RunResult]]) -> list[str]:
    return sorted(cell, key=lambda r: (ROUTER_ORDER.index(r) if r in ROUTER_ORDER else 99, r))


def cell_stats(runs: Sequence[RunResult]) -> dict[str, Spread]:
    return {f: spread(getattr(r.summary, f) for r in runs) for f in SUMMARY_FIELDS}


def summary_dict(results: Sequence[RunResult]) -> dict:
    """Per router (and per scenario when there are several): medians over seeds, for scripts."""
    cells = group(results)
    out: dict = {}
    for scenario, cell in cells.items():
        per_router = {}
        for router in routers_of(cell):
            stats = cell_stats(cell[router])
            per_router[router] = {"scenario": scenario, "seeds": len(cell[router]),
                                  **{f: stats[f].median for f in SUMMARY_FIELDS},
                                  "spread": {f: [stats[f].low, stats[f].high] for f in SUMMARY_FIELDS}}
        if len(cells) == 1:
            return per_router
        out[scenario] = per_router
    return out


def comparisons(cell: dict[str, list[RunResult]]) -> dict[str, float | None]:
    """gwtf vs swarm time reduction, gwtf/oracle throughput, per-crash waste (medians over seeds)."""
    med = {r: cell_stats(runs) for r, runs in cell.items()}
    out: dict[str, float | None] = dict.fromkeys(
        ("gwtf_time_reduction_vs_swarm", "gwtf_time_reduction_vs_swarm_barrier", "gwtf_throughput_vs_oracle",
         "swarm_throughput_vs_oracle", "gwtf_path_cost_vs_oracle", "swarm_path_cost_vs_oracle"))
    for baseline in ("swarm", "swarm-barrier"):
        if "gwtf" in med and baseline in cell:
            g, s = med["gwtf"]["time_to_n_s"].median, spread(_time_or_end(r) for r in cell[baseline]).median
            if g is not None and s:
                out["gwtf_time_reduction_vs_" + baseline.replace("-", "_")] = 1.0 - g / s
    for router in ("gwtf", "swarm"):
        if router in med and "oracle" in med and med["oracle"]["microbatches_per_s"].median:
            out[f"{router}_throughput_vs_oracle"] = (med[router]["microbatches_per_s"].median
                                                     / med["oracle"]["microbatches_per_s"].median)
        if router in med and "oracle" in med and med["oracle"]["mean_path_cost_s"].median:
            out[f"{router}_path_cost_vs_oracle"] = (med[router]["mean_path_cost_s"].median
                                                    / med["oracle"]["mean_path_cost_s"].median)
    return out


def _time_or_end(run: RunResult) -> float:
    """Time to the target, or the horizon for a run that missed it (a lower bound)."""
    return run.summary.time_to_n_s if run.summary.time_to_n_s is not None else run.summary.sim_end_s


def missed(runs: Sequence[RunResult]) -> int:
    """How many runs did not train the target within the horizon."""
    return sum(r.summary.time_to_n_s is None for r in runs)


def per_seed_reduction(cell: dict[str, list[RunResult]], baseline: str = "swarm") -> Spread:
    """gwtf's time reduction against ``baseline`` on each seed (same trace), as a spread; a
    baseline run that missed its target counts with the horizon (a lower bound)."""
    by_seed = {r.summary.seed: _time_or_end(r) for r in cell.get(baseline, [])}
    values = [1.0 - run.summary.time_to_n_s / by_seed[run.summary.seed] for run in cell.get("gwtf", [])
              if run.summary.seed in by_seed and run.summary.time_to_n_s]
    return spread(values)


def reduction_text(cell: dict[str, list[RunResult]], baseline: str = "swarm") -> str:
    """'54.7 % (48.2–56.0)': gwtf's median time reduction against ``baseline`` and its per-seed range."""
    key = "gwtf_time_reduction_vs_" + baseline.replace("-", "_")
    value = comparisons(cell).get(key)
    if value is None:
        return "—"
    per_seed = per_seed_reduction(cell, baseline)
    text = ("≥ " if missed(cell[baseline]) else "") + f"{100 * value:.1f} %"
    if per_seed.n > 1 and per_seed.low is not None and per_seed.high is not None:
        text += f" ({100 * per_seed.low:.1f}–{100 * per_seed.high:.1f})"
    return text


def markdown_table(results: Sequence[RunResult]) -> str:
    """One row per (scenario, router): medians with the range over seeds in brackets."""
    lines = ["| scenario | router | time to N (s) | microbatches/s | iteration (s) | GPU s wasted | crashes | "
             "wasted/crash (s) | idle | path cost (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for scenario, cell in group(results).items():
        for router in routers_of(cell):
            st = cell_stats(cell[router])
            lines.append(f"| {scenario} | {router} | {st['time_to_n_s'].text(0)} | "
                         f"{st['microbatches_per_s'].text(2)} | {st['median_iteration_s'].text(2)} | "
                         f"{st['wasted_gpu_s'].text(1)} | {st['crashes'].text(0)} | "
                         f"{st['wasted_gpu_s_per_crash'].text(2)} | {st['idle_fraction'].text(2)} | "
                         f"{st['mean_path_cost_s'].text(3)} |")
    return "\n".join(lines) + "\n"


def comparison_table(results: Sequence[RunResult]) -> str:
    lines = ["| scenario | gwtf time reduction vs swarm (per-seed range) | vs swarm-barrier | gwtf / oracle "
             "throughput | swarm / oracle throughput | gwtf / oracle path cost | swarm / oracle path cost |",
             "|---|---|---|---|---|---|---|"]
    for scenario, cell in group(results).items():
        ratio = {k: "—" if v is None else f"{v:.3f}" for k, v in comparisons(cell).items()}
        lines.append(f"| {scenario} | {reduction_text(cell)} | {reduction_text(cell, 'swarm-barrier')} | "
                     f"{ratio['gwtf_throughput_vs_oracle']} | {ratio['swarm_throughput_vs_oracle']} | "
                     f"{ratio['gwtf_path_cost_vs_oracle']} | {ratio['swarm_path_cost_vs_oracle']} |")
    return "\n".join(lines) + "\n"


def runs_csv(results: Sequence[RunResult]) -> str:
    buffer = io.StringIO()
    rows = [r.summary.as_dict() for r in results]
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def runs_json(results: Sequence[RunResult]) -> str:
    return json.dumps([{**r.summary.as_dict(), "crash_phases": r.crash_phases} for r in results], indent=1)
