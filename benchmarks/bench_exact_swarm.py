"""Benchmark: exact training end to end — real local swarms against one process on plain transformers classes.

Three measurements (issue 18's judgement), each printed side by side and saved to one JSON file:

* ``--fidelity``: a swarm of ``gwtf join`` processes (2 data holders, 2 stages: 2 replicas of stage 1, 1
  of stage 2) trains gpt2-tiny and llama-tiny for 200 iterations with global clipping; on the same
  token windows, the plain single process (``tests/unit/model/plain_reference.py``) with the specified
  exact arithmetic ("plain exact") and with the conventional float32 loop ("plain conventional":
  ``.grad`` accumulated in microbatch order, ``clip_grad_norm_``). Max |Δloss| over every microbatch and
  iteration, iterations clipped, the running max per iteration (plot with ``--plot``).
* ``--demos N``: N ``gwtf demo --json`` runs (2 relays per stage), one with 1 and one with 3 relays per
  stage, each loss list against the first run's and the plain single process's, to the bit.
* ``--churn N``: N ``gwtf demo --churn RATE --json`` runs (seeds 0..N-1): crashes, the iterations whose
  step lost a dead replica's contribution, whether the losses equal the crash-free ones up to the first
  of them, and how far they drift after it.

    python benchmarks/bench_exact_swarm.py --fidelity --iterations 200 --plot docs/img/exact-swarm.png
    python benchmarks/bench_exact_swarm.py --demos 5 --churn 5 --json docs/data/bench_exact_swarm.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.lifecycle.run_spec import DEMO_SPEC
from tests.integration.exact_support import (
    Training,
    compare,
    demo_losses,
    exact_spec,
    plain_run,
    run_swarm,
)

FIDELITY_CLIP = 0.7  # most of 200 iterations cross it, not all (plain exact: gpt2 155, llama 173)


def running_max(swarm: Training, other: Training, iterations: int) -> list[float]:
    """max |Δloss| over every microbatch of iterations 0..t, for each t."""
    out, worst = [], 0.0
    for t in range(iterations):
        worst = max(worst, *(abs(swarm.losses[t][k] - other.losses[t][k]) for k in other.losses[t]))
        out.append(worst)
    return out


def fidelity(iterations: int) -> list[dict[str, Any]]:
    """Each family with the run spec's default screen and with it off (0), each against the plain process."""
    rows = []
    for family in ("gpt2", "llama"):
        for screen in (None, 0.0):
            spec = exact_spec(family, grad_clip=FIDELITY_CLIP, screen_factor=screen)
            rows.append(fidelity_row(spec, iterations))
    return rows


def fidelity_row(spec: RunSpec, iterations: int) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gwtf-exact-") as work:
        swarm, in_sync = run_swarm(spec, iterations, Path(work), data_holders=2, replicas=(2, 1),
                                   timeout_s=60.0 * iterations)
    swarm_s = time.monotonic() - started
    exact = plain_run(spec, iterations, 2)
    conventional = plain_run(spec, iterations, 2, gradient="conventional")
    row = {"model": f"{spec.model_family}-tiny", "screen_factor": spec.screen_factor, "iterations": iterations,
           "replicas_in_sync": in_sync, "swarm_s": round(swarm_s, 1), "clipped_swarm": len(swarm.clipped),
           "clipped_plain": len(exact.clipped), "same_clipped_iterations": swarm.clipped == exact.clipped,
           "vs_plain_exact": compare(swarm, exact, range(iterations)),
           "vs_plain_conventional": compare(swarm, conventional, range(iterations)),
           "running_max_exact": running_max(swarm, exact, iterations),
           "running_max_conventional": running_max(swarm, conventional, iterations),
           "loss_first_last": [swarm.means[0], swarm.means[iterations - 1]]}
    e, c = row["vs_plain_exact"], row["vs_plain_conventional"]
    print(f"{row['model']:11} screen {spec.screen_factor:g}: {iterations} it, clipped "
          f"{row['clipped_swarm']}/{iterations} (plain {row['clipped_plain']}, same: "
          f"{row['same_clipped_iterations']}); vs plain exact: bitwise "
          f"{e['bitwise_equal']}/{iterations} (first differs at {e['first_difference']}), max |dloss| "
          f"{e['max_dloss_microbatch']:.1e}; vs plain conventional: max {c['max_dloss_microbatch']:.1e} (first "
          f"differs at {c['first_difference']}); in sync {in_sync}; swarm {swarm_s:.0f} s", flush=True)
    return row


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    colors = {"gpt2-tiny": "tab:blue", "llama-tiny": "tab:orange"}
    floor = 1e-9  # zeros drawn here on the log axis
    for row in rows:
        color, screen = colors.get(row["model"], "gray"), row.get("screen_factor", 0.0)
        if screen:
            ax.plot([max(v, floor) for v in row["running_max_exact"]], ":", color=color,
                    label=f"{row['model']}, screen {screen:g}: swarm vs plain exact")
            continue
        for key, style, what in (("running_max_conventional", "-", "plain conventional"),
                                 ("running_max_exact", "--", "plain exact")):
            ax.plot([max(v, floor) for v in row[key]], style, color=color,
                    label=f"{row['model']}, no screen: swarm vs {what}")
    ax.axhline(1e-6, color="gray", lw=0.8, ls=":")
    ax.text(1, 1.3e-6, "1e-6", color="gray", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(5e-10, 1.0)
    ax.set_xlabel("iteration")
    ax.set_ylabel("running max |Δloss| (zeros at 1e-9)")
    ax.set_title("A real swarm against one process on plain transformers classes")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def demos(runs: int, iterations: int) -> dict[str, Any]:
    """``runs`` default demos, then 1 and 3 relays per stage; every list against the first and the plain one."""
    plain = plain_run(DEMO_SPEC, iterations, 1)
    reference = [plain.means[t] for t in range(iterations)]
    cases = [2] * runs + [1, 3]
    results = []
    for i, relays in enumerate(cases):
        started = time.monotonic()
        summary = demo_losses("--iterations", str(iterations), "--relays-per-stage", str(relays))
        losses = summary["losses"]
        first = results[0]["losses"] if results else losses
        results.append({"run": i, "relays_per_stage": relays, "losses": losses,
                        "equal_to_first_run": losses == first, "equal_to_plain": losses == reference,
                        "max_dloss_plain": max(abs(a - b) for a, b in zip(losses, reference, strict=True)),
                        "replicas_in_sync": summary["replicas_in_sync"], "wall_s": round(time.monotonic() - started)})
        r = results[-1]
        print(f"demo {i} ({relays} relays/stage, {iterations} it): = first run {r['equal_to_first_run']}, = plain "
              f"{r['equal_to_plain']} (max |dloss| {r['max_dloss_plain']:.1e}), in sync {r['replicas_in_sync']}, "
              f"{r['wall_s']} s", flush=True)
    return {"iterations": iterations, "clipped_plain": len(plain.clipped), "plain_losses": reference, "runs": results}


def churn(runs: int, iterations: int, rate: float) -> dict[str, Any]:
    plain = plain_run(DEMO_SPEC, iterations, 1)
    reference = [plain.means[t] for t in range(iterations)]
    results = []
    for seed in range(runs):
        started = time.monotonic()
        try:
            summary = demo_losses("--iterations", str(iterations), "--churn", str(rate), "--chaos-seed", str(seed),
                                  keep_logs=True)
        except RuntimeError as e:  # a demo that did not finish is a result too: counted, not skipped
            results.append({"seed": seed, "failed": str(e)[-600:], "wall_s": round(time.monotonic() - started)})
            print(f"churn seed {seed}: FAILED after {results[-1]['wall_s']} s: {str(e)[-300:]}", flush=True)
            continue
        losses, c = summary["losses"], summary["churn"]
        lossy = c["lossy_iterations"]
        compared = lossy[0] + 1 if lossy else len(losses)
        deltas = [abs(a - b) for a, b in zip(losses, reference, strict=False)]
        results.append({"seed": seed, "crashes": c["crashes"], "by_mode": c["by_mode"],
                        "crash_iterations": [p["iteration"] for p in c["per_crash"]],
                        "lost_microbatches": c["lost_microbatches"],
                        "contributions_lost": c["contributions_lost_with_dead_replicas"], "lossy_iterations": lossy,
                        "redone_steps": c.get("redone_steps"), "redone_microbatches": c.get("redone_microbatches"),
                        "rebuilt_microbatches": c.get("rebuilt_microbatches"),
                        "equal_until_first_lossy": losses[:compared] == reference[:compared],
                        "equal_all": losses == reference, "max_dloss_after": max(deltas[compared:], default=0.0),
                        "dloss_last": deltas[-1] if deltas else None, "violations": c["violations"],
                        "wall_s": round(time.monotonic() - started)})
        r = results[-1]
        logs = summary.get("logs")
        if logs and r["equal_all"]:
            shutil.rmtree(logs, ignore_errors=True)
        elif logs:  # a run that differs keeps its daemons' logs (INFO), to read why
            r["logs"] = logs
        print(f"churn seed {seed}: {r['crashes']} crashes {r['by_mode']}, {r['redone_microbatches']} microbatches "
              f"redone in {r['redone_steps']} steps ({r['rebuilt_microbatches']} with a half rebuilt), "
              f"contributions lost {r['contributions_lost']} "
              f"in iterations {lossy}; = crash-free until then: {r['equal_until_first_lossy']}, all: {r['equal_all']}; "
              f"max |dloss| after {r['max_dloss_after']:.1e}, last {r['dloss_last']:.1e}; {r['wall_s']} s"
              + (f"; logs kept in {r['logs']}" if "logs" in r else ""), flush=True)
    finished = [r for r in results if "failed" not in r]
    print(f"churn: {sum(r['equal_all'] for r in finished)} of {len(finished)} finished runs bitwise equal to the "
          f"crash-free demo; {len(results) - len(finished)} of {len(results)} did not finish")
    return {"iterations": iterations, "rate": rate, "runs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fidelity", action="store_true", help="real swarm vs plain single process, tiny presets")
    parser.add_argument("--iterations", type=int, default=200, help="iterations of --fidelity")
    parser.add_argument("--plot", help="PNG of the running max |dloss| (with --fidelity)")
    parser.add_argument("--demos", type=int, default=0, help="default gwtf demo runs (then 1 and 3 relays per stage)")
    parser.add_argument("--churn", type=int, default=0, help="gwtf demo --churn runs")
    parser.add_argument("--demo-iterations", type=int, default=40)
    parser.add_argument("--rate", type=float, default=0.34, help="crashes per iteration of --churn")
    parser.add_argument("--json", help="write every figure here (merged into an existing file)")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if args.json and Path(args.json).exists():
        out = json.loads(Path(args.json).read_text())
    if args.fidelity:
        out["fidelity"] = fidelity(args.iterations)
        if args.plot:
            plot(out["fidelity"], args.plot)
    if args.demos:
        out["demos"] = demos(args.demos, args.demo_iterations)
    if args.churn:
        out["churn"] = churn(args.churn, args.demo_iterations, args.rate)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
