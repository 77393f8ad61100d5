"""Run the simulator's grid and variants for gwtf, SWARM and the oracle; write the simulator section
of docs/benchmarks.md, its plots (docs/img/sim-*.png) and the raw results (docs/data/bench_sim.json).

Routers: ``gwtf``, ``swarm`` (SWARM as released: no global barrier), ``swarm-barrier`` (SWARM held
to gwtf's iteration barrier) and the ``oracle``. The grid is geo10 × {homogeneous, heterogeneous} ×
churn {0, 10, 16, 33 %/h} × {llama500m, gpt1.3b}; the variants are the headline scenario with
refused connections, the uniform, home (with and without the flow's uplink model) and ideal
networks, and the 100-node scenario whose CPU time is the performance check. The ``ideal``
variant also gets a GPU busy trace of every relay. Only the part of docs/benchmarks.md between
the ``bench_sim`` markers is rewritten. Measures and reports; asserts nothing.

    python benchmarks/bench_sim.py --seeds 5 --workers 2
    python benchmarks/bench_sim.py --from-raw docs/data/bench_sim.json   # re-render from saved runs
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from sim_runs import check_reproduces, from_raw, pending, run_all, timed, to_raw  # benchmarks/, beside this

from gwtfp2p.sim.batch import Job, jobs_for
from gwtfp2p.sim.plots import plot_before_after, plot_busy, plot_throughput, plot_time_to_n
from gwtfp2p.sim.report import (
    cell_stats,
    comparisons,
    group,
    markdown_table,
    routers_of,
)
from gwtfp2p.sim.scenarios import get_scenario, grid
from gwtfp2p.sim.simulation import RunResult, Simulation

ROUTERS = ("gwtf", "swarm", "swarm-barrier", "oracle")
HEADLINE = "geo10-het-c33-llama500m"
REFUSED = HEADLINE + "-refused"
HOME = "home-het-c16-llama500m"
FLAT_HOME = HOME + "-flat-uplink"
IDEAL = "ideal-hom-c0-llama500m"
OTHER_VARIANTS = ("uniform-het-c16-llama500m", HOME, IDEAL)
SCALE = "scale100-het-c33-llama500m"
PLOTTED = (HEADLINE, REFUSED, "geo10-hom-c0-llama500m", "geo10-het-c33-gpt1.3b", IDEAL, HOME)
BEGIN, END = "<!-- bench_sim:begin -->", "<!-- bench_sim:end -->"
TRAINERS = {HEADLINE: (48,), REFUSED: (12, 48), HOME: (4, 24)}  # SWARM's concurrency, swept
BARRIER_CELLS = (HEADLINE, REFUSED, "geo10-het-c0-llama500m", "geo10-hom-c0-llama500m", "geo10-het-c16-llama500m",
                 IDEAL, HOME)  # where swarm-barrier runs too
BEFORE = Path("docs/data/sim_before_issue19.json")


def build_jobs(seeds: int, variant_seeds: int, scale: bool, only: str) -> list[Job]:
    jobs = []
    for scenario in [*grid(), get_scenario(REFUSED)]:
        jobs += jobs_for(scenario, _routers(scenario.name), seeds)
    for name in OTHER_VARIANTS:
        jobs += jobs_for(get_scenario(name), _routers(name), variant_seeds)
    flat = replace(get_scenario(HOME), name=FLAT_HOME, flow_uplink_aware=False)
    jobs += jobs_for(flat, ("gwtf", "oracle"), variant_seeds)
    for name, counts in TRAINERS.items():
        base = get_scenario(name)
        for count in counts:
            swept = replace(base, name=f"{name}-trainers{count}", swarm=replace(base.swarm, trainers_per_dh=count))
            jobs += jobs_for(swept, ("swarm",), seeds if name != HOME else variant_seeds)
    if scale:
        jobs += jobs_for(get_scenario(SCALE), ("gwtf", "swarm", "oracle"), 1)
    jobs = [j for j in jobs if only in j.scenario.name]
    # seed by seed (a run cut short still has whole seeds), the 100-node timing last
    return sorted(jobs, key=lambda j: (j.scenario.name == SCALE, j.seed, j.scenario.name, j.router))


def _routers(name: str) -> tuple[str, ...]:
    return ROUTERS if name in BARRIER_CELLS else ("gwtf", "swarm", "oracle")


# -- the ideal trace -----------------------------------------------------------------------------------
def busy_trace(name: str, routers: tuple[str, ...], warm_s: float,
               window_s: float) -> dict[str, list[tuple[int, str, float, float]]]:
    """Every relay's compute intervals in a window of one seeded run per router."""
    traces = {}
    for router in routers:
        sim = Simulation(get_scenario(name), 0, router)
        intervals: list[tuple[int, str, float, float]] = []
        done = sim.cluster.on_task_done

        def record(node, task, done=done, intervals=intervals, sim=sim):
            if not node.is_data_holder and sim.engine.now >= warm_s - task[4]:
                intervals.append((node.stage, node.node_id, sim.engine.now - task[4], sim.engine.now))
            done(node, task)
        sim.cluster.on_task_done = record
        sim.start()
        sim.engine.run(warm_s + window_s)
        traces[router] = intervals
    return traces


ABLATIONS = (("SWARM as released", {}), ("backward on its forward's server", {"backward_to_forward_server": True}),
             ("no recompute", {"recompute": False}),
             ("both", {"backward_to_forward_server": True, "recompute": False}))


def ablation_table(seed: int = 0) -> list[str]:
    """What SWARM's ``ideal`` gap is made of: the same seed with one of its mechanisms switched off."""
    base = get_scenario(IDEAL)
    gwtf = Simulation(base, seed, "gwtf").run().summary
    lines = [f"| {IDEAL}, seed {seed} | time to N (s): swarm | iteration (s) | swarm-barrier | iteration (s) |",
             "|---|---|---|---|---|", f"| gwtf | {gwtf.time_to_n_s:.0f} | {gwtf.median_iteration_s:.2f} | | |"]
    for label, change in ABLATIONS:
        scenario = replace(base, swarm=replace(base.swarm, **change))
        runs = [Simulation(scenario, seed, router).run().summary for router in ("swarm", "swarm-barrier")]
        lines.append(f"| {label} | " + " | ".join(f"{s.time_to_n_s:.0f} | {s.median_iteration_s:.2f}" for s in runs)
                     + " |")
    return [*lines, ""]


def busy_summary(traces: dict[str, list[tuple[int, str, float, float]]], window: tuple[float, float]) -> list[str]:
    """Per router: the relays' busy fraction in the window and how unevenly a stage's relays are loaded
    (the busiest relay's compute over the stage's mean, averaged over stages)."""
    start, end = window
    lines = ["| router | relays' busy fraction | busiest / mean relay of a stage |", "|---|---|---|"]
    for router, intervals in traces.items():
        busy: dict[tuple[int, str], float] = {}
        for stage, node, a, b in intervals:
            busy[(stage, node)] = busy.get((stage, node), 0.0) + max(0.0, min(b, end) - max(a, start))
        stages = sorted({stage for stage, _ in busy})
        imbalance = [max(v for (s, _), v in busy.items() if s == stage)
                     / statistics.fmean(v for (s, _), v in busy.items() if s == stage) for stage in stages]
        fraction = sum(busy.values()) / (len(busy) * (end - start))
        lines.append(f"| {router} | {fraction:.2f} | {statistics.fmean(imbalance):.2f} |")
    return [*lines, ""]


# -- the report -------------------------------------------------------------------------------------------
def matched(cell: dict, baseline: str, router: str = "gwtf") -> dict:
    """``router``'s and ``baseline``'s runs on the seeds both ran (same churn trace; a run cut short leaves some)."""
    if router not in cell or baseline not in cell:
        return {}
    seeds = {r.summary.seed for r in cell[router]} & {r.summary.seed for r in cell[baseline]}
    return {x: [r for r in cell[x] if r.summary.seed in seeds] for x in (router, baseline)}


def mean_range(values: list[float], digits: int = 0, scale: float = 1.0) -> str:
    """'12.3 (10.1–14.5)': the mean over seeds and their range; one seed: its value."""
    if not values:
        return "—"
    fmt = f"{{:.{digits}f}}"
    text = fmt.format(scale * statistics.fmean(values))
    if len(values) > 1:
        text += f" ({fmt.format(scale * min(values))}–{fmt.format(scale * max(values))})"
    return text


def _per_seed(cell: dict, baseline: str, ratio, router: str = "gwtf") -> list[float]:
    pair = matched(cell, baseline, router)
    base = {r.summary.seed: r.summary for r in pair.get(baseline, [])}
    return [ratio(r.summary, base[r.summary.seed]) for r in pair.get(router, [])]


def reduction(cell: dict, baseline: str = "swarm") -> str:
    """gwtf's time reduction against ``baseline`` seed by seed, mean % (range); ≥: a baseline run missed N."""
    values = _per_seed(cell, baseline, lambda g, b: 1.0 - g.time_to_n_s / (b.time_to_n_s or b.sim_end_s))
    lower = any(r.summary.time_to_n_s is None for r in matched(cell, baseline).get(baseline, []))
    return ("≥ " if lower and values else "") + mean_range(values, 1, 100.0) + (" %" if values else "")


def side_by_side(cells: dict, names: list[str]) -> list[str]:
    """Per scenario: time to N of every router (mean over its seeds, range), then gwtf's ratios seed by seed."""
    lines = ["| scenario | seeds (gwtf/swarm/barrier/oracle) | time to N (s): gwtf | swarm | swarm-barrier | oracle | "
             "gwtf's time reduction vs swarm | vs swarm-barrier | throughput gwtf / swarm | gwtf / oracle | "
             "swarm / oracle |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        cell = cells[name]
        times = [mean_range([r.summary.time_to_n_s or r.summary.sim_end_s for r in cell.get(router, [])])
                 for router in ROUTERS]
        seeds = "/".join(str(len(cell.get(router, []))) for router in ROUTERS)
        thr = [mean_range(_per_seed(cell, b, lambda g, o: g.microbatches_per_s / o.microbatches_per_s, r), 3)
               for r, b in (("gwtf", "swarm"), ("gwtf", "oracle"), ("swarm", "oracle"))]
        lines.append(f"| {name} | {seeds} | {' | '.join(times)} | {reduction(cell)} | "
                     f"{reduction(cell, 'swarm-barrier')} | {' | '.join(thr)} |")
    return [*lines, ""]


def headline(cells: dict, before: dict) -> list[str]:
    lines = ["### Headline", ""]
    for name, label in ((HEADLINE, "crashed hosts vanish (silent)"),
                        (REFUSED, "crashed hosts refuse connections (refused)")):
        if name not in cells:
            continue
        cell, old = cells[name], before.get(name, {})
        n = cell["gwtf"][0].summary.target_microbatches
        lines.append(f"* **{label}** (geo10, heterogeneous GPUs, 33 %/h churn, {n} microbatches): gwtf needs "
                     f"**{reduction(cell)}** less time than SWARM as released "
                     f"({len(matched(cell, 'swarm').get('swarm', []))} seed(s): mean, range), "
                     f"{reduction(cell, 'swarm-barrier')} less than SWARM held to gwtf's barrier "
                     f"({len(matched(cell, 'swarm-barrier').get('swarm-barrier', []))} seed(s)); before "
                     f"issue 19: {old.get('reduction_pct', '—')} % ({old.get('per_seed_low_pct', '—')}–"
                     f"{old.get('per_seed_high_pct', '—')}, median of 5 seeds).")
        lines += [f"  * against SWARM with {count} trainers per data holder ({len(runs)} seed(s)): "
                  f"{reduction({'gwtf': cell['gwtf'], 'swarm': runs})} (< 0: SWARM trains sooner)"
                  for count, runs in _swept(cells, name)]
    ratios = {name: comparisons(cell)["gwtf_throughput_vs_oracle"] for name, cell in cells.items() if name != SCALE}
    ratios = {k: v for k, v in ratios.items() if v is not None}
    if ratios:
        low = min(ratios, key=ratios.get)
        lines.append(f"* gwtf's throughput is {min(ratios.values()):.3f}–{max(ratios.values()):.3f} of the oracle's "
                     f"over all scenarios (median {statistics.median(ratios.values()):.3f}; lowest: {low}).")
    flat = cells.get(FLAT_HOME, {})
    if HOME in cells and "gwtf" in flat:
        home_time = cell_stats(cells[HOME]["gwtf"])["time_to_n_s"].text(0)
        flat_time = cell_stats(flat["gwtf"])["time_to_n_s"].text(0)
        lines.append(f"* `{HOME}` (issue 15's criterion): gwtf needs {reduction(cells[HOME])} less time than "
                     f"SWARM as released; gwtf takes {home_time} s with the flow's uplink model, {flat_time} s "
                     "without it.")
    return [*lines, ""]


def _swept(cells: dict, name: str) -> list[tuple[int, list[RunResult]]]:
    """SWARM's runs of ``name`` with another number of trainers per data holder."""
    return [(count, cells[f"{name}-trainers{count}"]["swarm"]) for count in TRAINERS.get(name, ())
            if f"{name}-trainers{count}" in cells]


def before_after(cells: dict, before: dict) -> list[str]:
    lines = ["| scenario | before: gwtf vs swarm (median of 5 or 3 seeds, range) | seeds now | now: vs swarm as "
             "released (mean, range) | now: vs swarm at the barrier | gwtf s before → now | "
             "swarm s before → now (released / barrier) |", "|---|---|---|---|---|---|---|"]
    for name, cell in cells.items():
        old = before.get(name)
        if old is None or "gwtf" not in cell:
            continue
        now = {r: mean_range([x.summary.time_to_n_s or x.summary.sim_end_s for x in cell.get(r, [])])
               for r in ("gwtf", "swarm", "swarm-barrier")}
        times = old.get("time_to_n_s", {})
        lines.append(f"| {name} | {old['reduction_pct']:.1f} % ({old['per_seed_low_pct']:.1f}–"
                     f"{old['per_seed_high_pct']:.1f}) | {len(cell['gwtf'])} | {reduction(cell)} | "
                     f"{reduction(cell, 'swarm-barrier')} | {times.get('gwtf', 0):.0f} → "
                     f"{now['gwtf']} | {times.get('swarm', 0):.0f} → {now['swarm']} / {now['swarm-barrier']} |")
    return [*lines, ""]


def before_after_plot(cells: dict, before: dict, path: Path) -> Path:
    rows = []
    for name, cell in cells.items():
        if name == SCALE:  # timing runs: two simulated hours, no time to N to compare
            continue
        now = {b: _per_seed(cell, b, lambda g, o: 100 * (1 - g.time_to_n_s / (o.time_to_n_s or o.sim_end_s)))
               for b in ("swarm", "swarm-barrier")}
        if name in before and now["swarm"]:
            barrier = statistics.fmean(now["swarm-barrier"]) if now["swarm-barrier"] else float("nan")
            rows.append((name, before[name]["reduction_pct"], barrier, statistics.fmean(now["swarm"])))
    return plot_before_after(rows, path, "gwtf vs SWARM: before issue 19 and now (no bar: not run)")


def trainers_table(cells: dict) -> list[str]:
    """SWARM's time with more or fewer trainer processes (microbatches in flight) against gwtf's."""
    lines = ["| scenario | SWARM trainers per data holder | seeds | SWARM time to N (s) | gwtf's time reduction "
             "(same seeds) |", "|---|---|---|---|---|"]
    for name, counts in TRAINERS.items():
        if name not in cells:
            continue
        rows = [(get_scenario(name).swarm.trainers_per_dh or get_scenario(name).microbatches_per_dh, cells[name])]
        rows += [(count, {"gwtf": cells[name]["gwtf"], "swarm": cells[f"{name}-trainers{count}"]["swarm"]})
                 for count in counts if f"{name}-trainers{count}" in cells]
        for count, cell in sorted(rows, key=lambda r: r[0]):
            lines.append(f"| {name} | {count} | {len(cell['swarm'])} | "
                         f"{mean_range([r.summary.time_to_n_s or r.summary.sim_end_s for r in cell['swarm']])} | "
                         f"{reduction(cell)} |")
    return [*lines, ""]


def waste_table(results: list[RunResult]) -> list[str]:
    lines = ["| scenario | gwtf GPU s wasted / crash | swarm | swarm-barrier | oracle | "
             "recovered hops gwtf / SWARM retries |", "|---|---|---|---|---|---|"]
    for name, cell in group(results).items():
        if "-c0-" in name or "ideal" in name:
            continue
        st = {r: cell_stats(cell[r]) for r in routers_of(cell)}
        per_crash = [st[r]["wasted_gpu_s_per_crash"].text(2) if r in st else "—" for r in ROUTERS]
        hops = " / ".join(st[r]["recoveries"].text(0) if r in st else "—" for r in ("gwtf", "swarm"))
        lines.append(f"| {name} | {' | '.join(per_crash)} | {hops} |")
    return [*lines, ""]


def timing_table(timed_runs: list[tuple[RunResult, float, float]]) -> list[str]:
    lines = ["| router | simulated | microbatches | events | CPU s | wall s |", "|---|---|---|---|---|---|"]
    for result, cpu_s, wall_s in sorted(timed_runs, key=lambda t: t[0].summary.router):
        s = result.summary
        if s.scenario == SCALE:
            lines.append(f"| {s.router} | {s.sim_end_s / 3600:.1f} h | {s.completed} | {s.events} | {cpu_s:.0f} | "
                         f"{wall_s:.0f} |")
    if len(lines) == 2:
        return ["Not measured in this run (the 100-node runs come last and were not reached).", ""]
    return [*lines, ""]


def plots(cells: dict, img: Path) -> list[str]:
    figures = []
    for name in PLOTTED:
        if name in cells:
            runs = [r for runs in cells[name].values() for r in runs]
            figures.append(plot_time_to_n(runs, img / f"sim-{name}-time.png").name)
            if any(r.throughput for r in runs):
                figures.append(plot_throughput(runs, img / f"sim-{name}-throughput.png").name)
    return figures


def _coverage(timed_runs: list, meta: dict) -> str:
    """How much of the planned run the saved results hold (a run stopped early keeps whole seeds)."""
    seeds = sorted({t[0].summary.seed for t in timed_runs})
    if len(timed_runs) >= meta.get("jobs", 0):
        return f"{len(timed_runs)} runs, {meta['seeds']} seeds per grid cell"
    return (f"**{len(timed_runs)} of the {meta['jobs']} planned runs: the run was stopped early**, so the cells "
            f"hold seeds {', '.join(map(str, seeds))} only, not {meta['seeds']}: the number of seeds is given per "
            "cell, and a spread over one or two seeds is not a distribution")


def section(timed_runs: list[tuple[RunResult, float, float]], img: Path, meta: dict,
            trace: tuple[str, list[str]] | None) -> list[str]:
    results = [t[0] for t in timed_runs]
    before = json.loads(BEFORE.read_text())["scenarios"] if BEFORE.exists() else {}
    cells = group(results)
    grid_names = {s.name for s in grid()}
    grid_runs = [r for r in results if r.summary.scenario in grid_names]
    variant_runs = [r for r in results if r.summary.scenario not in grid_names and r.summary.scenario != SCALE
                    and "-trainers" not in r.summary.scenario]
    img.mkdir(parents=True, exist_ok=True)
    figures = [before_after_plot(cells, before, img / "sim-before-after.png").name, *plots(cells, img)]
    cpu_min = sum(t[1] for t in timed_runs) / 60
    return [
        BEGIN, "", "## The simulator: gwtf vs SWARM vs the oracle", "",
        f"Generated by `python benchmarks/bench_sim.py --seeds {meta['seeds']} --workers {meta['workers']}` at "
        f"commit {meta['commit']} (Python {meta['python']}, {meta['elapsed_min']:.0f} min on this 2-core machine "
        f"shared with other work, {cpu_min:.0f} CPU-minutes; raw results in `docs/data/bench_sim.json`): "
        f"{_coverage(timed_runs, meta)}. Re-rendered without simulating by "
        "`python benchmarks/bench_sim.py --from-raw docs/data/bench_sim.json`. Comparisons are seed by seed (a "
        "seed's churn trace is the same for every router) on the seeds both routers ran: the mean over those seeds "
        "with their range in brackets; the detailed tables give the median and range. `swarm` is SWARM as released "
        "(no global barrier: each stage steps on its own), `swarm-barrier` the same trainers and servers held to "
        "gwtf's iteration barrier. A time marked ≥ would be a lower bound (a run that missed N within the 6 h "
        "horizon, counted with the horizon). Modelling choices and their sources: [sim.md](sim.md).", "",
        *headline(cells, before),
        "### Before and after issue 19", "",
        "gwtf's time reduction against SWARM, before (the old SWARM model, exact costs for gwtf) and now.", "",
        *before_after(cells, before),
        "![before and after](img/sim-before-after.png)", "",
        "### The grid: geo10 × compute × churn × model", "",
        "Time to train the scenario's N microbatches (60 000 for llama500m, 35 000 for gpt1.3b), throughput "
        "(N / time), median iteration time (without a barrier: the interval between a stage's optimizer steps), "
        "GPU time wasted (compute discarded by crashes), crashes during the run, GPU seconds wasted per crash, "
        "the relays' idle fraction and the mean realized path cost d.", "",
        "#### gwtf against SWARM and the oracle, side by side", "",
        *side_by_side(cells, sorted({r.summary.scenario for r in grid_runs})),
        "#### Every metric (median over the seeds run, range)", "",
        markdown_table(grid_runs),
        "#### GPU time wasted per crash", "",
        *waste_table(grid_runs),
        "### Variants", "",
        "The headline scenario with refused connections, and other networks (uniform: 50 ms, 1 Gbit/s "
        "everywhere; home: geo10 latencies behind 20–100 Mbit/s uplinks, with and without the flow's uplink "
        "model; ideal: no latency, unlimited bandwidth, identical GPUs).", "",
        *side_by_side(cells, sorted({r.summary.scenario for r in variant_runs})),
        markdown_table(variant_runs),
        *([f"![busy relays, {IDEAL}](img/{trace[0]})", "", *trace[1]] if trace else
          [f"The `{IDEAL}` GPU busy trace and SWARM's ablations (`busy_trace`, `ablation_table`) are computed after "
           "the runs and are not in the saved results: not measured in this run.", ""]),
        "### SWARM's concurrency", "",
        "SWARM's trainers each keep one microbatch in flight and its servers keep nothing between requests, so "
        "its concurrency is the number of trainer processes, not bounded by the relays' memory. By default a "
        "data holder runs as many trainers as it has microbatches per iteration (as many in flight as gwtf's "
        "demand; each stage's step then averages about one iteration's worth); on `home`, 8 (see sim.md). "
        "More trainers means more microbatches in flight across each stage's optimizer steps (staler "
        "gradients, which a throughput simulator does not price).", "",
        *trainers_table(cells),
        "### Performance: 100 nodes, two simulated hours", "",
        f"`{SCALE}` (16 relays per stage, 4 data holders, 33 %/h churn), one process each. CPU seconds are the "
        "fair figure (the machine is shared).", "",
        *timing_table(timed_runs),
        "### Plots", "",
        *[f"![{f}](img/{f})" for f in figures[1:]], "",
        END,
    ]


def write_section(docs: Path, lines: list[str]) -> None:
    """Replace the text between the markers (or append it): other sections of the file stay."""
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    block = "\n".join(lines)
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    docs.write_text(text)


def _simulate(args: argparse.Namespace) -> tuple[list[tuple[RunResult, float, float]], dict]:
    """Run the planned jobs (with ``--resume``, those the saved runs lack); save every ten results."""
    jobs = build_jobs(args.seeds, args.variant_seeds, not args.no_scale, args.only)
    started = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"seeds": args.seeds, "workers": args.workers, "commit": commit or "?",
            "python": platform.python_version(), "elapsed_min": 0.0, "jobs": len(jobs)}
    saved: list[tuple[RunResult, float, float]] = []
    if args.resume and args.raw.exists():
        raw = json.loads(args.raw.read_text())
        saved = from_raw(raw)
        for line in check_reproduces(saved, jobs, timed):
            print(line, flush=True)
        meta.update(commit=f"{raw['meta']['commit']} (resumed at {meta['commit']})",
                    elapsed_min=raw["meta"]["elapsed_min"])
        jobs = pending(jobs, saved)
        print(f"resuming: {len(saved)} saved runs kept, {len(jobs)} to run", flush=True)
    prior_min = meta["elapsed_min"]
    args.raw.parent.mkdir(parents=True, exist_ok=True)

    def save(done: list) -> None:
        meta["elapsed_min"] = prior_min + (time.perf_counter() - started) / 60
        args.raw.write_text(json.dumps(to_raw(saved + done, meta, PLOTTED), indent=0))
    new_runs = run_all(jobs, args.workers, save)
    save(new_runs)
    return saved + new_runs, meta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--variant-seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--raw", type=Path, default=Path("docs/data/bench_sim.json"))
    parser.add_argument("--from-raw", type=Path, help="re-render the report from saved runs; run nothing")
    parser.add_argument("--docs", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--img", type=Path, default=Path("docs/img"))
    parser.add_argument("--only", default="", help="run only scenarios whose name contains this")
    parser.add_argument("--no-scale", action="store_true", help="skip the 100-node timing runs")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs saved in --raw and run only the missing jobs (sim_runs.py)")
    args = parser.parse_args()
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        timed_runs, meta = from_raw(raw), raw["meta"]
    else:
        timed_runs, meta = _simulate(args)
    trace = None
    args.img.mkdir(parents=True, exist_ok=True)
    if args.from_raw:  # re-render only: the trace and ablations are simulations, taken from the file if saved
        saved = raw.get("ideal_trace")
        trace = (saved["figure"], saved["lines"]) if saved and (args.img / saved["figure"]).exists() else None
    elif any(r.summary.scenario == IDEAL for r, _, _ in timed_runs):
        warm_s, window_s = 60.0, 4.0
        traces = busy_trace(IDEAL, ("gwtf", "swarm", "swarm-barrier"), warm_s, 60.0)
        figure = plot_busy(traces, args.img / "sim-ideal-busy.png", (warm_s, warm_s + window_s),
                           f"{IDEAL}: GPU busy, {window_s:.0f} s after {warm_s:.0f} s of warm-up, seed 0").name
        trace = (figure, ["Over the first 60 s after the warm-up (seed 0):", "",
                          *busy_summary(traces, (warm_s, warm_s + 60.0)),
                          "SWARM's mechanisms switched off one at a time (ablations, not SWARM; same seed):", "",
                          *ablation_table()])
        args.raw.write_text(json.dumps({**to_raw(timed_runs, meta, PLOTTED),
                                        "ideal_trace": {"figure": trace[0], "lines": trace[1]}}, indent=0))
    write_section(args.docs, section(timed_runs, args.img, meta, trace))
    print(f"wrote {args.docs} and {args.img}/sim-*.png" + ("" if args.from_raw else f"; raw runs in {args.raw}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
