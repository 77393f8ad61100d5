"""PNG plots of simulated runs (matplotlib, Agg backend): time to N per router, throughput over time.

Kept apart from report.py so that the text reports never import matplotlib. Each function writes
one small PNG and returns its path. matplotlib is the optional ``plots`` extra: it is imported when
a plot is drawn, and ``PlotsUnavailable`` says how to install it where it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gwtfp2p.sim.report import cell_stats, group, routers_of
from gwtfp2p.sim.simulation import RunResult

COLORS = {"gwtf": "tab:blue", "swarm": "tab:orange", "swarm-barrier": "tab:red", "oracle": "tab:green"}
SMOOTH_BINS = 5


class PlotsUnavailable(RuntimeError):
    """matplotlib (the ``plots`` extra) is not installed; the message says how to install it."""


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable("PNG plots need matplotlib: pip install 'gwtfp2p[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_time_to_n(results: Sequence[RunResult], path: Path, title: str = "") -> Path:
    """Median time to train the target per router, with the range over seeds as error bars."""
    plt = _pyplot()
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
    plt = _pyplot()
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


def plot_busy(traces: dict[str, list[tuple[int, str, float, float]]], path: Path, window_s: tuple[float, float],
              title: str = "") -> Path:
    """GPU busy intervals of every relay in a time window, one panel per router (a Gantt chart).

    ``traces`` maps a router to (stage, node, start s, end s) intervals; rows are the relays sorted
    by stage, so a barrier shows as a vertical gap through all stages.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(traces), 1, figsize=(7.0, 1.6 + 1.4 * len(traces)), dpi=100, sharex=True,
                             squeeze=False)
    start, end = window_s
    for ax, (router, intervals) in zip(axes[:, 0], traces.items(), strict=True):
        rows = sorted({(stage, node) for stage, node, _, _ in intervals})
        index = {row: i for i, row in enumerate(rows)}
        for i in range(1, len(rows)):
            if rows[i][0] != rows[i - 1][0]:
                ax.axhline(i - 0.5, color="black", linewidth=0.4)  # a stage boundary
        for stage, node, a, b in intervals:
            if b > start and a < end:
                ax.barh(index[(stage, node)], min(b, end) - max(a, start), left=max(a, start) - start, height=0.8,
                        color=COLORS.get(router, "grey"), linewidth=0)
        ax.set_yticks([])
        ax.set_ylabel(f"{router}\nrelays by stage", fontsize=7)
        ax.set_xlim(0, end - start)
    axes[-1, 0].set_xlabel("seconds (coloured: the relay's GPU is computing)")
    axes[0, 0].set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_before_after(rows: list[tuple[str, float, float, float]], path: Path, title: str = "") -> Path:
    """gwtf's time reduction vs SWARM per scenario: (label, before %, after %, after without barrier %)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 0.35 * len(rows) + 1.2), dpi=100)
    y = list(range(len(rows)))
    height = 0.27
    for offset, column, label, color in ((-height, 1, "before (issue 19)", "lightgrey"),
                                         (0.0, 2, "now, SWARM at gwtf's barrier", COLORS["swarm-barrier"]),
                                         (height, 3, "now, SWARM as released", COLORS["swarm"])):
        ax.barh([i + offset for i in y], [r[column] for r in rows], height=height, label=label, color=color)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(y)
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("gwtf's time reduction vs SWARM (%, median over seeds; < 0: SWARM faster)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
