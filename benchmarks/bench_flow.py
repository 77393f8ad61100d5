"""Measure the decentralized flow protocol against the centralized oracle (issue 2's judged numbers).

Runs, for each instance family, N seeds of: a fresh solve; a re-solve after 20 % of relays crash
and after 20 % new relays join (compared with the oracle on the changed swarm and with a fresh
protocol run on it); and a run with 10 % message loss and reordering with invariants checked at
every tick. Prints markdown tables; ``--json FILE`` keeps the raw rows. Measures, asserts nothing.

    python benchmarks/bench_flow.py --seeds 50 --workers 2 --json out/bench_flow.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus, NetworkModel
from gwtfp2p.flow.churn import add_relays, remove_relays
from gwtfp2p.flow.generate import FAMILIES, generate
from gwtfp2p.flow.oracle import solve

MAX_TICKS = 1500


def flow_params(items: list[str]) -> FlowParams:
    """The default ``FlowParams`` with ``--flow-param NAME=VALUE`` overrides (a variant measured against the
    defaults; booleans as true / false)."""
    kinds = {f.name: f.type for f in dataclasses.fields(FlowParams)}
    parse = {"bool": {"true": True, "false": False}.get, "int": int, "float": float}
    changes = {}
    for item in items:
        name, _, text = item.partition("=")
        value = parse[kinds[name]](text) if kinds.get(name) in parse else None
        if value is None:
            raise SystemExit(f"--flow-param {item!r}: expected NAME=VALUE, NAME a bool, int or float field of "
                             f"FlowParams ({', '.join(n for n, k in kinds.items() if k in parse)})")
        changes[name] = value
    return FlowParams(**changes)


def fresh(family: str, seed: int, params: FlowParams) -> dict:
    instance = generate(family, seed)
    oracle = solve(instance).quality
    started = time.perf_counter()
    result = MessageBus(instance, seed=seed, params=params).run(max_ticks=MAX_TICKS)
    q = result.quality
    return {"family": family, "seed": seed, "flow_ratio": q.flow_value / max(1, oracle.flow_value),
            "flow_equal": q.flow_value == oracle.flow_value, "cost_ratio": q.total_cost / oracle.total_cost,
            "max_path_ratio": q.max_path_cost / oracle.max_path_cost, "ticks": result.ticks_to_converge,
            "messages_per_node": result.messages_to_converge / len(instance.nodes),
            "converged": result.converged, "wall_s": time.perf_counter() - started}


def churn(family: str, seed: int, change: str, params: FlowParams) -> dict:
    instance = generate(family, seed)
    bus = MessageBus(instance, seed=seed, params=params)
    bus.run(max_ticks=MAX_TICKS)
    (remove_relays if change == "remove" else add_relays)(bus, instance, 0.2, seed)
    result = bus.run(max_ticks=MAX_TICKS)
    changed = bus.instance()
    oracle = solve(changed).quality
    restart = MessageBus(changed, seed=seed, params=params).run(max_ticks=MAX_TICKS).quality
    q = result.quality
    return {"family": family, "seed": seed, "change": change, "flow_equal": q.flow_value == oracle.flow_value,
            "flow_ratio": q.flow_value / max(1, oracle.flow_value), "cost_ratio": q.total_cost / oracle.total_cost,
            "restart_cost_ratio": restart.total_cost / oracle.total_cost, "ticks": result.ticks_to_converge,
            "converged": result.converged}


def lossy(family: str, seed: int, params: FlowParams) -> dict:
    instance = generate(family, seed)
    bus = MessageBus(instance, seed=seed, params=params, network=NetworkModel(delay_ticks=1, jitter_ticks=2, loss=0.1),
                     check_every_tick=True)
    result = bus.run(max_ticks=MAX_TICKS)
    oracle = solve(instance).quality
    return {"family": family, "seed": seed, "violations": len(bus.violations),
            "flow_ratio": result.quality.flow_value / max(1, oracle.flow_value),
            "cost_ratio": result.quality.total_cost / oracle.total_cost, "ticks": result.ticks_to_converge}


def _call(job):
    fn, args = job
    return fn(*args)


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_fresh(rows):
    print("| family | seeds | flow = oracle | min flow ratio | cost ratio median / p90 | max-path ratio median / p90 "
          "| ticks median / p90 | messages per node median / p90 |")
    print("|---|---|---|---|---|---|---|---|")
    for family in FAMILIES:
        r = [x for x in rows if x["family"] == family]
        if not r:
            continue
        cost, mp = [x["cost_ratio"] for x in r], [x["max_path_ratio"] for x in r]
        ticks, msgs = [x["ticks"] for x in r], [x["messages_per_node"] for x in r]
        print(f"| {family} | {len(r)} | {sum(x['flow_equal'] for x in r)}/{len(r)} "
              f"({100 * sum(x['flow_equal'] for x in r) / len(r):.0f} %) | {min(x['flow_ratio'] for x in r):.3f} "
              f"| {statistics.median(cost):.3f} / {pct(cost, 0.9):.3f} "
              f"| {statistics.median(mp):.3f} / {pct(mp, 0.9):.3f} "
              f"| {statistics.median(ticks):.0f} / {pct(ticks, 0.9):.0f} "
              f"| {statistics.median(msgs):.0f} / {pct(msgs, 0.9):.0f} |")


def report_churn(rows):
    print("| family | change | seeds | flow = oracle | cost ratio median (restart from scratch) "
          "| ticks to recover median / p90 / max |")
    print("|---|---|---|---|---|---|")
    for family in FAMILIES:
        for change in ("remove", "add"):
            r = [x for x in rows if x["family"] == family and x["change"] == change]
            if not r:
                continue
            ticks = [x["ticks"] for x in r]
            print(f"| {family} | {change} 20 % | {len(r)} | {sum(x['flow_equal'] for x in r)}/{len(r)} "
                  f"| {statistics.median(x['cost_ratio'] for x in r):.3f} "
                  f"({statistics.median(x['restart_cost_ratio'] for x in r):.3f}) "
                  f"| {statistics.median(ticks):.0f} / {pct(ticks, 0.9):.0f} / {max(ticks)} |")


def report_lossy(rows):
    print("| family | seeds | invariant violations | min flow ratio | cost ratio median |")
    print("|---|---|---|---|---|")
    for family in FAMILIES:
        r = [x for x in rows if x["family"] == family]
        if r:
            print(f"| {family} | {len(r)} | {sum(x['violations'] for x in r)} | {min(x['flow_ratio'] for x in r):.3f} "
                  f"| {statistics.median(x['cost_ratio'] for x in r):.3f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--churn-seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--flow-param", action="append", default=[], metavar="NAME=VALUE",
                        help="a FlowParams field for every run (repeatable), e.g. loop_free_labels=true")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    params = flow_params(args.flow_param)
    started = time.perf_counter()
    jobs = [(fresh, (f, s, params)) for f in families for s in range(args.seeds)]
    jobs += [(churn, (f, s, c, params)) for f in families for s in range(args.churn_seeds) for c in ("remove", "add")]
    jobs += [(lossy, (f, s, params)) for f in families for s in range(args.churn_seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_call, jobs))
    n_fresh = len(families) * args.seeds
    n_churn = len(families) * args.churn_seeds * 2
    fresh_rows, churn_rows = results[:n_fresh], results[n_fresh:n_fresh + n_churn]
    lossy_rows = results[n_fresh + n_churn:]
    print("## Fresh solve vs oracle\n")
    report_fresh(fresh_rows)
    print("\n## Churn: 20 % of relays removed / added after convergence\n")
    report_churn(churn_rows)
    print("\n## 10 % message loss, reordering (jitter 0-2 ticks), invariants checked every tick\n")
    report_lossy(lossy_rows)
    print(f"\n(wall time {time.perf_counter() - started:.0f} s with {args.workers} workers)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"fresh": fresh_rows, "churn": churn_rows, "lossy": lossy_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
