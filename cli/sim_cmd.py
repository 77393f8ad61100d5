"""``gwtf sim``: run a named scenario for gwtf, swarm and the oracle over several seeds.

Runs the (router, seed) jobs in a process pool with a progress bar, prints the markdown table
(or CSV / JSON with ``--format``) and writes to ``--out``: ``table.md``, ``runs.csv``,
``runs.json``, ``summary.json`` (per router: medians over seeds) and two PNG plots.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gwtfp2p.config import ConfigError
from gwtfp2p.sim.params import ROUTERS, DataPlaneParams, Scenario
from gwtfp2p.sim.scenarios import all_scenarios, get_scenario

if TYPE_CHECKING:  # the simulator's engine and routers (the oracle: scipy, networkx) load when a run starts
    from gwtfp2p.sim.batch import Job
    from gwtfp2p.sim.simulation import RunResult

FORMATS = ("md", "csv", "json")


def _routers(values: list[str] | None) -> tuple[str, ...]:
    names = tuple(v.strip() for value in (values or []) for v in value.split(",") if v.strip())
    return names or ROUTERS


def _scenario(name: str, target: int | None, horizon_s: float | None, churn: float | None,
              crash_mode: str | None, codec: str | None = None) -> Scenario:
    scenario = get_scenario(name)
    changes: dict = {} if codec is None else {"codec": codec}
    if target is not None:
        changes["target_microbatches"] = target
    if horizon_s is not None:
        changes["horizon_s"] = horizon_s
    if churn is not None:
        changes["churn_pct_per_hour"] = churn
    if crash_mode is not None:
        changes["dataplane"] = replace(scenario.dataplane, crash_mode=crash_mode)
    return replace(scenario, **changes) if changes else scenario


def run_jobs(jobs: list[Job], workers: int, console: Console) -> list[RunResult]:
    """Run the jobs (in a process pool when ``workers`` > 1) with a progress bar."""
    from gwtfp2p.sim.batch import run_job

    results: list[RunResult] = []
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("simulating", total=len(jobs))
        if workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                progress.update(task, description=f"{job.router} seed {job.seed}")
                results.append(run_job(job))
                progress.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for result in pool.map(run_job, jobs):
                    progress.update(task, description=f"{result.summary.router} seed {result.summary.seed}")
                    results.append(result)
                    progress.advance(task)
    return results


def write_outputs(results: list[RunResult], out: Path) -> list[Path]:
    from gwtfp2p.sim.plots import PlotsUnavailable, plot_throughput, plot_time_to_n
    from gwtfp2p.sim.report import comparison_table, markdown_table, runs_csv, runs_json, summary_dict

    out.mkdir(parents=True, exist_ok=True)
    files = {
        "table.md": markdown_table(results) + "\n" + comparison_table(results),
        "runs.csv": runs_csv(results),
        "runs.json": runs_json(results),
        "summary.json": json.dumps(summary_dict(results), indent=1),
    }
    written = []
    for name, text in files.items():
        (out / name).write_text(text)
        written.append(out / name)
    try:
        written.append(plot_time_to_n(results, out / "time_to_n.png"))
        written.append(plot_throughput(results, out / "throughput.png"))
    except PlotsUnavailable as exc:
        print(f"gwtf sim: no plots ({exc})", file=sys.stderr)
    return written


def sim(
    scenario: str = typer.Option("", "--scenario", help="Scenario name (see --list)."),
    seeds: int = typer.Option(5, "--seeds", min=1, help="Seeds per router (same seed, same churn trace)."),
    router: list[str] = typer.Option(None, "--router", help="gwtf, swarm, oracle (the default), or swarm-barrier "
                                       "(SWARM held to gwtf's barrier); repeat or comma-separate."),
    out: Path = typer.Option(Path("sim-out"), "--out", help="Directory for the table, CSV, JSON and plots."),
    jobs: int = typer.Option(0, "--jobs", min=0, help="Worker processes (0: one per CPU)."),
    fmt: str = typer.Option("md", "--format", help="What to print: md, csv or json."),
    target: int = typer.Option(None, "--target-microbatches", help="Override the scenario's N."),
    horizon_s: float = typer.Option(None, "--horizon-s", help="Override the simulated time limit."),
    churn: float = typer.Option(None, "--churn", help="Override the churn (% of relays per hour)."),
    crash_mode: str = typer.Option(None, "--crash-mode", help="silent (hosts vanish) or refused."),
    codec: str = typer.Option(None, "--codec", help="Wire codec of activations, gradients and the all-reduce: "
                              "none (bf16 as computed), float16, bfloat16, blockwise8 (docs/transport.md)."),
    list_: bool = typer.Option(False, "--list", help="List the scenarios and exit."),
) -> None:
    """Simulate a scenario for gwtf, the SWARM baseline and the oracle; write a table and plots."""
    from gwtfp2p.sim.batch import jobs_for
    from gwtfp2p.sim.report import comparison_table, markdown_table, runs_csv, summary_dict

    console = Console(stderr=True)
    if list_:
        for name, spec in all_scenarios().items():
            print(f"{name:36s} {spec.description}")
        return
    try:
        if not scenario:
            raise ConfigError("--scenario: name a scenario (see `gwtf sim --list`)")
        if fmt not in FORMATS:
            raise ConfigError(f"--format: use one of {', '.join(FORMATS)}, got {fmt!r}")
        if crash_mode is not None:
            DataPlaneParams(crash_mode=crash_mode)
        spec = _scenario(scenario, target, horizon_s, churn, crash_mode, codec)
        job_list = jobs_for(spec, _routers(router), seeds)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    workers = jobs or os.cpu_count() or 1
    results = run_jobs(job_list, workers, console)
    written = write_outputs(results, out)
    if fmt == "md":
        print(markdown_table(results) + "\n" + comparison_table(results))
    elif fmt == "csv":
        print(runs_csv(results))
    else:
        print(json.dumps(summary_dict(results), indent=1))
    console.print("wrote " + ", ".join(str(p) for p in written))
