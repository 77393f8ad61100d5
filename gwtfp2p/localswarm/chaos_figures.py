"""What a chaos run did to training, from the daemons' events: correctness checks and per-crash figures.

Checks (``violations``): every live data holder closed every iteration with all its microbatches,
each loss recorded once; every part's replicas reported one state hash per step; every part
counted each microbatch at most once (exactly once unless a replica of it died in that iteration,
taking its contribution along); the loss went down. Figures: extra time per crash (from iteration
wall times and from the ``recovery`` events' ``extra_s``), recomputed hops per crash and per
affected microbatch. docs/churn.md defines each one.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from gwtfp2p.localswarm.processes import Daemon

RESENDS = ("forward_resend", "backward_resend")
LOSS_WINDOW = 5


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def iteration_walls(holder: Daemon) -> dict[int, float]:
    """Wall seconds of each iteration on ``holder``: from its previous ``iteration`` event to this one
    (iteration 0: its own ``seconds``), so waits for routes and aggregation are included."""
    events = holder.of("iteration")
    walls = {}
    for i, event in enumerate(events):
        walls[event["iteration"]] = event["seconds"] if i == 0 else event["time"] - events[i - 1]["time"]
    return walls


def _iteration_of(key: str | None) -> int | None:
    parts = (key or "").split("/")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def check_holders(holders: list[Daemon], microbatches: int, iterations: int) -> list[str]:
    """Every iteration of every live data holder closed with all its microbatches, each loss once."""
    problems = []
    total = microbatches * len(holders)
    for holder in holders:
        events = holder.of("iteration")
        if [e["iteration"] for e in events] != list(range(iterations)):
            problems.append(f"{holder.name}: iterations {[e['iteration'] for e in events]}")
        peer = holder.of("ready")[0]["peer_id"] if holder.of("ready") else "?"
        for e in events:
            keys = {f"{peer}/{e['iteration']}/{i}" for i in range(microbatches)}
            if e["lost_microbatches"] or e["microbatches"] != microbatches or set(e["losses"]) != keys:
                problems.append(f"{holder.name} iteration {e['iteration']}: {e['microbatches']} closed, "
                                f"{e['lost_microbatches']} lost, losses of {sorted(e['losses'])}")
            if e["swarm_microbatches"] != total:
                problems.append(f"{holder.name} iteration {e['iteration']}: swarm loss over "
                                f"{e['swarm_microbatches']} microbatches, not {total}")
    return problems


def _last_steps(daemon: Daemon) -> int:
    steps = [e["iteration"] for e in daemon.of("step")]
    ready = daemon.of("ready")
    first = ready[0]["from_iteration"] if ready else 0
    return max(steps, default=first - 1)


def check_parts(daemons: list[Daemon], holders: list[Daemon], crashes: list[dict], n_stages: int,
                total: int, iterations: int) -> tuple[list[str], dict[str, int]]:
    """Replica hashes agree per part and step; counts are exact except where a replica died during
    the iteration (then at most ``total``). A victim's last step is left out where survivors stepped
    the same iteration: it may have decided alone (the fast path) just before dying, before they had
    its contribution; its state died with it (a replica that downloaded it would disagree in its own
    steps). Returns (problems, {dying steps, those that differ from the survivors', contributions lost with
    dead replicas, the iterations whose step lost some (``lossy_iterations``: from the first on, the training
    differs from a crash-free run's; before it, the exact sums keep it bitwise the same)})."""
    by_name = {d.name: d for d in daemons}
    last = {c["victim"]: _last_steps(by_name[c["victim"]]) for c in crashes if c["victim"] in by_name}
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    counts: dict[tuple[int, int], set[int]] = defaultdict(set)
    dying: list[dict] = []
    for daemon in daemons:
        for e in daemon.of("step"):
            if last.get(daemon.name) == e["iteration"]:
                dying.append(e)
                continue
            hashes[(e["stage"], e["iteration"])].add(e["hash"])
            counts[(e["stage"], e["iteration"])].add(e["count"])
    compared = [e for e in dying if (e["stage"], e["iteration"]) in hashes]
    for e in dying:  # the only replica that stepped this iteration: nothing to leave out
        if e not in compared:
            hashes[(e["stage"], e["iteration"])].add(e["hash"])
            counts[(e["stage"], e["iteration"])].add(e["count"])
    for holder in holders:
        for e in holder.of("iteration"):
            hashes[(0, e["iteration"])].add(e["hash"])
            counts[(0, e["iteration"])].add(e["count"])
    allowed = {(c["stage"], last[c["victim"]] + d) for c in crashes if c["victim"] in last for d in (0, 1)}
    problems = [f"stage {k} iteration {t}: replicas disagree {sorted(h)}" for (k, t), h in hashes.items() if len(h) > 1]
    dropped, lossy = 0, set()
    for stage in range(n_stages + 1):
        for t in range(iterations):
            seen = counts.get((stage, t))
            if not seen:
                problems.append(f"stage {stage} iteration {t}: no step by a surviving replica")
            elif max(seen) > total or (min(seen) < total and (stage, t) not in allowed):
                problems.append(f"stage {stage} iteration {t}: counted {sorted(seen)} of {total} microbatches")
            else:
                dropped += total - min(seen)
                if min(seen) < total:
                    lossy.add(t)
    diverged = sum(1 for e in compared if e["hash"] not in hashes[(e["stage"], e["iteration"])])
    return problems, {"dying_steps": len(compared), "dying_steps_diverged": diverged,
                      "contributions_lost_with_dead_replicas": dropped, "lossy_iterations": sorted(lossy)}


def crash_figures(crashes: list[dict], holder: Daemon, daemons: list[Daemon], iterations: int) -> dict[str, Any]:
    """Per-crash figures (see docs/churn.md, "Measuring a crash")."""
    walls = iteration_walls(holder)
    recoveries = [e for d in daemons for e in d.of("recovery")]
    victims = {c["peer_id"]: c for c in crashes}
    touched: dict[int, set[int]] = defaultdict(set)  # iteration -> crashes that touched it
    for c in crashes:
        touched[c["iteration"]].add(c["index"])
    for e in recoveries:
        t = _iteration_of(e.get("microbatch"))
        if e.get("lost") in victims and t is not None:
            touched[t].add(victims[e["lost"]]["index"])
        for peer in e.get("replicas", []):  # a redo of left-out work (``contribution_redone``)
            if peer in victims:
                touched[e["iteration"]].add(victims[peer]["index"])
    for d in daemons:
        for e in d.of("step"):
            for peer in e.get("dropped", []):
                if peer in victims:
                    touched[e["iteration"]].add(victims[peer]["index"])
    clean = [s for t, s in walls.items() if t >= 1 and not touched.get(t)]
    baseline = statistics.median(clean) if clean else None
    per_crash = []
    for c in crashes:
        mine = [e for e in recoveries if e.get("lost") == c["peer_id"] and e["kind"] in RESENDS]
        iters = [t for t, who in touched.items() if c["index"] in who and t in walls and t < iterations]
        extra = (sum((walls[t] - baseline) / len(touched[t]) for t in iters) if baseline is not None and iters
                 else None)
        per_crash.append({**c, "touched_iterations": sorted(iters), "extra_s": extra,
                          "recovery_extra_s": max((e["extra_s"] for e in mine), default=0.0),
                          "detect_s": min((e["detect_s"] for e in mine if e.get("detect_s") is not None), default=None),
                          "affected_microbatches": len({e["microbatch"] for e in mine}),
                          "recomputed_hops": sum(e["recomputed_hops"] for e in mine)})
    resends = [e for e in recoveries if e["kind"] in RESENDS]
    attributed = [e for e in resends if e.get("lost") in victims]
    redone: dict[tuple[int, int], int] = {}  # (stage, iteration) -> microbatches redone (each member redoes them)
    rebuilt: dict[tuple[int, int], int] = {}  # of them, with a half rebuilt (two neighbouring replicas lost)
    for e in recoveries:
        if e["kind"] == "contribution_redone":
            key = (e.get("stage", 0), e["iteration"])
            redone[key] = max(redone.get(key, 0), e["microbatches"])
            rebuilt[key] = max(rebuilt.get(key, 0), e.get("rebuilt", 0))
    extras = [p["extra_s"] for p in per_crash if p["extra_s"] is not None]
    recovery_extras = [p["recovery_extra_s"] for p in per_crash if p["affected_microbatches"]]
    affected = sum(p["affected_microbatches"] for p in per_crash)
    hops = sum(e["recomputed_hops"] for e in resends)
    return {
        "clean_iteration_s": baseline, "extra_s_per_crash_mean": mean(extras), "extra_s_per_crash_p95": p95(extras),
        "recovery_extra_s_mean": mean(recovery_extras), "recovery_extra_s_p95": p95(recovery_extras),
        "recomputed_hops": hops, "affected_microbatches": affected,
        "recomputed_hops_per_crash": hops / len(crashes) if crashes else None,
        "recomputed_hops_per_affected_microbatch": (sum(e["recomputed_hops"] for e in attributed) / affected
                                                    if affected else None),
        "max_recomputed_hops": max((e["recomputed_hops"] for e in resends), default=0),
        "unattributed_resends": len(resends) - len(attributed),
        "redone_steps": len(redone), "redone_microbatches": sum(redone.values()),
        "rebuilt_microbatches": sum(rebuilt.values()),
        "per_crash": per_crash,
    }


def loss_trend(holder: Daemon) -> tuple[float | None, float | None]:
    """Mean loss of the first and of the last ``LOSS_WINDOW`` iterations (fewer in a short run)."""
    losses = [e["loss"] for e in holder.of("iteration") if e.get("loss") is not None]
    window = min(LOSS_WINDOW, len(losses) // 2)
    if window == 0:
        return None, None
    return statistics.fmean(losses[:window]), statistics.fmean(losses[-window:])


def run_figures(crashes: list[dict], holders: list[Daemon], daemons: list[Daemon], n_stages: int,
                microbatches: int, iterations: int, unplanned: list[Daemon] = ()) -> dict[str, Any]:
    """Checks and figures of one chaos run (``violations`` empty: it passed). ``unplanned``: daemons that
    died while no crash was planned for them (a failure of the run; their last step counts as dying)."""
    problems = check_holders(holders, microbatches, iterations)
    problems += [f"{d.name} died unexpectedly (not a chaos victim): {d.stderr_tail(2)}" for d in unplanned]
    dead = crashes + [{"victim": d.name, "stage": d.of("ready")[0]["stage"]} for d in unplanned if d.of("ready")]
    part_problems, parts = check_parts(daemons, holders, dead, n_stages, microbatches * len(holders), iterations)
    first, last = loss_trend(holders[0])
    loss_down = first is not None and last is not None and last < first
    if not loss_down:
        problems.append(f"loss did not go down: first {LOSS_WINDOW} {first}, last {LOSS_WINDOW} {last}")
    lost = sum(max(e["lost_microbatches"], microbatches - len(e["losses"])) for h in holders
               for e in h.of("iteration"))
    return {"iterations": len(holders[0].of("iteration")), "lost_microbatches": lost,
            "replicas_in_sync": not any("disagree" in p for p in part_problems),
            **parts,
            "loss_first": first, "loss_last": last, "loss_down": loss_down,
            **crash_figures(crashes, holders[0], daemons, iterations),
            "violations": problems + part_problems}
