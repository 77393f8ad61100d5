"""PNG plots of simulated runs (matplotlib, Agg backend): time to N per router, throughput over time.

Kept apart from report.py so that the text reports never import matplotlib. Each function writes
one small PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gwtfp2p.sim.report import cell_stats, group, routers_of
from gwtfp2p.sim.simulation import RunResult

COLORS = {"gwtf": "tab:blue", "swarm": "tab:orange", "oracle": "tab:green"}
SMOOTH_BINS = 5


def plot_time_to_n(results: Sequence[RunResult], path: Path, title: str = "") -> Path:
    """Median time to train the target per router, with the range over seeds as error bars."""
    cells = group(results)
    scenario, cell = next(iter(cells.items()))
    routers = routers_of(cell)
    medians, lows, highs = [], [], []
    for router in routers:
        st = cell_stats(cell[router])["time_to_n_s"]
        m = st.median or 0.0
        medians.append(m / 60.0)
        lows.append(max(0.0, m - (st.low or m)) / 60.0)
        highs.append(max(0.0, (st.high or m) - m) / 60.0)
    fig, ax = plt.subplots(figsize=(4.2, 3.0), dpi=100)
    ax.bar(routers, medians, yerr=[lows, highs], capsize=4, color=[COLORS.get(r, "grey") for r in routers])
    ax.set_ylabel(f"minutes to {cell[routers[0]][0].summary.target_microbatches} microbatches")
    ax.set_title(title or scenario, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _smooth(series: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    times = [t / 60.0 for t, _ in series]
    rates = [r for _, r in series]
    smoothed = []
    for i in range(len(rates)):
        window = rates[max(0, i - SMOOTH_BINS + 1): i + 1]
        smoothed.append(sum(window) / len(window))
    return times, smoothed


def plot_throughput(results: Sequence[RunResult], path: Path, seed: int | None = None, title: str = "") -> Path:
    """Microbatches/s over time (5-bin moving mean) for one seed; crashes as red ticks, joins as green."""
    cells = group(results)
    scenario, cell = next(iter(cells.items()))
    routers = routers_of(cell)
    chosen = seed if seed is not None else cell[routers[0]][0].summary.seed
    fig, ax = plt.subplots(figsize=(6.4, 3.0), dpi=100)
    runs = [r for router in routers for r in cell[router] if r.summary.seed == chosen]
    longest = max(runs, key=lambda r: r.summary.sim_end_s, default=None)
    for run in runs:
        times, rates = _smooth(run.throughput)
        ax.plot(times, rates, label=run.summary.router, color=COLORS.get(run.summary.router), linewidth=1.0)
    if longest is not None:  # the trace is the same for every router; the longest run shows most of it
        for t in longest.crash_times:
            ax.axvline(t / 60.0, color="red", alpha=0.25, linewidth=0.8)
        for t in longest.join_times:
            ax.axvline(t / 60.0, color="green", alpha=0.15, linewidth=0.8, linestyle=":")
    ax.set_xlabel("simulated minutes (red: crashes, green dotted: joins)")
    ax.set_ylabel("microbatches / s")
    ax.set_title(title or f"{scenario}, seed {chosen}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
