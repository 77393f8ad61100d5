"""``bench_sim.py``'s runs: the worker pool, the raw results file (saved every ten runs, read back to
re-render), and resuming (``--resume``): the saved runs are kept and only the jobs they lack run.

Old and new runs are compared side by side in one report, so they must come from one simulator: before
anything runs, the cheapest saved runs are simulated again and must reproduce their saved summaries field
by field (every figure, the event count included). A simulator that changed since is refused with what
differs; then the whole grid has to run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed

from gwtfp2p.sim.batch import Job, run_job
from gwtfp2p.sim.metrics import RunSummary
from gwtfp2p.sim.simulation import RunResult

TimedRun = tuple[RunResult, float, float]  # the result, its CPU seconds and its wall seconds


def timed(job: Job) -> TimedRun:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_job(job)
    return result, time.process_time() - cpu, time.perf_counter() - wall


def run_all(jobs: list[Job], workers: int, save) -> list[TimedRun]:
    """Run the jobs in a pool; ``save(done)`` every ten results (a run cut short keeps them)."""
    done = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(timed, job) for job in jobs]
        for future in as_completed(futures):
            result, cpu_s, wall_s = future.result()
            done.append((result, cpu_s, wall_s))
            if len(done) % 10 == 0:
                save(done)
            s = result.summary
            print(f"[{len(done)}/{len(jobs)} {time.perf_counter() - started:6.0f}s] {s.scenario} {s.router} "
                  f"seed {s.seed}: {s.time_to_n_s} s, cpu {cpu_s:.1f}s", flush=True)
    return done


def to_raw(timed_runs: list[TimedRun], meta: dict, plotted: Collection[str]) -> dict:
    """The runs as JSON (time series only for the ``plotted`` scenarios)."""
    runs = []
    for result, cpu_s, wall_s in timed_runs:
        keep_series = result.summary.scenario in plotted
        runs.append({"summary": result.summary.as_dict(), "cpu_s": cpu_s, "wall_s": wall_s,
                     "crash_phases": result.crash_phases,
                     "throughput": result.throughput if keep_series else [],
                     "crash_times": result.crash_times if keep_series else [],
                     "join_times": result.join_times if keep_series else []})
    return {"meta": meta, "runs": runs}


def from_raw(raw: dict) -> list[TimedRun]:
    out = []
    for run in raw["runs"]:
        series = [tuple(p) for p in run["throughput"]]
        if len(series) > 2 and run["summary"]["sim_end_s"] - series[-1][0] < (series[1][0] - series[0][0]) / 2:
            series.pop()  # a last bin a sliver wide (the end a rounding past a bin's start): its rate is noise
        result = RunResult(RunSummary(**run["summary"]), series, run["crash_times"], run["join_times"],
                           run["crash_phases"])
        out.append((result, run["cpu_s"], run["wall_s"]))
    return out


def job_key(scenario: str, router: str, seed: int) -> tuple[str, str, int]:
    return scenario, router, seed


def saved_keys(saved: Iterable[TimedRun]) -> set[tuple[str, str, int]]:
    return {job_key(r.summary.scenario, r.summary.router, r.summary.seed) for r, _, _ in saved}


def pending(jobs: list[Job], saved: list[TimedRun]) -> list[Job]:
    """The planned jobs no saved run answers, in their planned order."""
    done = saved_keys(saved)
    return [j for j in jobs if job_key(j.scenario.name, j.router, j.seed) not in done]


def check_reproduces(saved: list[TimedRun], jobs: list[Job], run: Callable[[Job], TimedRun],
                     count: int = 2) -> list[str]:
    """Simulate the ``count`` cheapest saved runs again; raise ``SystemExit`` naming the fields that differ
    if any summary does, else return one line per run checked."""
    planned = {job_key(j.scenario.name, j.router, j.seed): j for j in jobs}
    candidates = sorted((cpu_s, result) for result, cpu_s, _ in saved
                        if job_key(result.summary.scenario, result.summary.router, result.summary.seed) in planned)
    if not candidates:
        raise SystemExit("--resume: no saved run is part of this plan, so none can be checked; run without --resume")
    lines = []
    for _, result in candidates[:count]:
        s = result.summary
        again = run(planned[job_key(s.scenario, s.router, s.seed)])[0].summary.as_dict()
        differ = {k: (v, again.get(k)) for k, v in s.as_dict().items() if again.get(k) != v}
        if differ:
            raise SystemExit(f"--resume: {s.scenario} {s.router} seed {s.seed} no longer reproduces its saved run "
                             f"(saved, now): {differ}; the simulator changed since, so run the whole grid again "
                             "without --resume")
        lines.append(f"{s.scenario} {s.router} seed {s.seed}: reproduced ({s.events} events, time to N "
                     f"{s.time_to_n_s} s)")
    return lines
