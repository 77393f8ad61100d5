"""Measure the flow protocol on the oversubscribed ``tight`` family (issue 15's judged numbers).

For each seed, runs the MessageBus for ``--ticks`` ticks (default 3,000) and records at every tick
the routed units (complete chains), the edge-unit assignment and the messages sent, then reports:

- flow == oracle maximum at the end, and the tick from which it stayed there;
- the cost ratio against the oracle (at the end);
- the tick the protocol *reported* convergence (``MessageBus.run``'s rule: routing unchanged for
  60 ticks and no data holder with demand seeing a next hop with spare capacity) and the routing
  changes after it. Two kinds of change are counted between consecutive ticks:
  *path change*: the multiset of complete node paths (what the data plane carries) differs;
  *assignment change*: the set of edge units held, ``(edge id, prev, holder)`` over every node's
  in-units (complete or not, so surplus units moving between relays count), differs;
- messages per tick over the last 1,000 ticks, by message kind in ``--json``;
- surplus: in-units at relays that are not on a complete chain (mean over the last 1,000 ticks);
- each data holder's routed units against the oracle's max-min fair share (max |difference|);
- for runs below the maximum, whether the end state is a blocking flow (no path from a holder to
  its own sink through relays that all have spare capacity);

and a lossy variant (loss 0.1, delay 1, jitter 2, invariants checked at every tick): flow over
oracle at the end and its minimum over the last 1,000 ticks, and the invariant violations.
Prints markdown tables; ``--json FILE`` keeps the raw rows. Measures, asserts nothing. One process.

    python benchmarks/bench_flow_tight.py --seeds 50 --lossy-seeds 20 --json out/bench_flow_tight.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from bench_flow import flow_params  # benchmarks/, beside this

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus, NetworkModel, Settling
from gwtfp2p.flow.generate import generate
from gwtfp2p.flow.oracle import solve

QUIET_TICKS = 60  # MessageBus.run's rule for "converged"
TAIL = 1000


class CountingBus(MessageBus):
    """A MessageBus that counts the messages sent by kind (before loss)."""

    def __init__(self, *args, **kwargs) -> None:
        self.kinds: Counter[str] = Counter()
        super().__init__(*args, **kwargs)

    def send(self, src, envelopes) -> None:
        for envelope in envelopes:
            self.kinds[type(envelope.message).__name__] += 1
        super().send(src, envelopes)


def assignment(bus: MessageBus) -> frozenset:
    """Every edge unit held anywhere: (edge id, prev, holder)."""
    return frozenset((e, u.prev, n) for n, node in bus.nodes.items() for e, u in node.core.ins.items())


def surplus(bus: MessageBus, paths) -> int:
    """In-units held at relays that are not part of a complete chain."""
    held = sum(len(node.core.ins) for node in bus.nodes.values() if node.stage > 0)
    return held - len(paths) * bus.n_stages


def forward_path_exists(instance, paths) -> bool:
    """Whether some holder could gain a unit along relays that all have spare capacity (if not,
    the routing is a blocking flow: every augmenting path needs a backward edge)."""
    load = Counter(n for p in paths for n in p[1:-1])
    spare = {n.node_id for n in instance.nodes if n.stage > 0 and n.capacity > load[n.node_id]}
    adj: dict[str, set[str]] = {}
    for a, b in instance.edge_costs:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    stage = {n.node_id: n.stage for n in instance.nodes}
    for holder in (n.node_id for n in instance.nodes if n.stage == 0):
        frontier = {holder}
        for s in range(1, instance.n_stages + 1):
            frontier = {y for x in frontier for y in adj.get(x, ()) if stage[y] == s and y in spare}
        if any(holder in adj.get(x, ()) for x in frontier):
            return True
    return False


class Trace:
    """Per-tick records of one run."""

    def __init__(self) -> None:
        self.flow: list[int] = []
        self.path_change: list[bool] = []
        self.assign_change: list[bool] = []
        self.messages: list[int] = []
        self.surplus: list[int] = []
        self.flips: Counter[str] = Counter()  # node -> ticks on which its routing version moved
        self.declared: int | None = None


def trace_run(bus: CountingBus, ticks: int) -> tuple[Trace, list]:
    trace = Trace()
    last_paths, last_assign = sorted(bus.routing()), assignment(bus)
    versions = {n: node.routing_version for n, node in bus.nodes.items()}
    settling, tail_kinds = Settling(QUIET_TICKS, 0, 0), Counter()
    for tick in range(1, ticks + 1):
        if tick == ticks - TAIL + 1:
            tail_kinds = Counter(bus.kinds)
        bus.step()
        paths, assign = sorted(bus.routing()), assignment(bus)
        trace.flow.append(len(paths))
        trace.path_change.append(paths != last_paths)
        trace.assign_change.append(assign != last_assign)
        trace.messages.append(bus.messages)
        trace.surplus.append(surplus(bus, paths))
        if trace.declared is None and settling.note(tick, paths != last_paths, bus.work_under_way()):
            trace.declared = tick
        if tick > ticks - TAIL:
            for n, node in bus.nodes.items():
                if node.routing_version != versions[n]:
                    trace.flips[n] += 1
        versions = {n: node.routing_version for n, node in bus.nodes.items()}
        last_paths, last_assign = paths, assign
    kinds = bus.kinds - tail_kinds
    return trace, [kinds, paths]


def stayed_from(series: list[int], target: int) -> int | None:
    """First tick (1-based) from which ``series`` equals ``target`` to the end."""
    if not series or series[-1] != target:
        return None
    k = len(series)
    while k > 0 and series[k - 1] == target:
        k -= 1
    return k + 1


def fresh(seed: int, ticks: int, params: FlowParams | None = None) -> dict:
    instance = generate("tight", seed)
    oracle = solve(instance)
    started = time.perf_counter()
    bus = CountingBus(instance, seed=seed, params=params)
    trace, (kinds, _paths) = trace_run(bus, ticks)
    q, best = bus.quality(), oracle.quality
    fair = oracle.holder_flows()
    mine = Counter(p[0] for p in bus.routing())
    holders = sorted(n.node_id for n in instance.nodes if n.stage == 0)
    after = trace.declared or ticks
    tail = slice(ticks - TAIL, ticks)
    return {
        "seed": seed, "stages": instance.n_stages, "nodes": len(instance.nodes), "oracle_flow": best.flow_value,
        "flow": q.flow_value, "flow_equal": q.flow_value == best.flow_value,
        "blocking": q.flow_value < best.flow_value and not forward_path_exists(instance, bus.routing()),
        "stayed_from": stayed_from(trace.flow, best.flow_value),
        "cost_ratio": q.total_cost / best.total_cost if best.total_cost else 1.0,
        "declared": trace.declared,
        "path_changes_after": sum(trace.path_change[after:]), "assign_changes_after": sum(trace.assign_change[after:]),
        "last_path_change": max((i + 1 for i, c in enumerate(trace.path_change) if c), default=0),
        "flow_min_tail": min(trace.flow[tail]), "flow_max_tail": max(trace.flow[tail]),
        "messages_per_tick_tail": (trace.messages[-1] - trace.messages[ticks - TAIL - 1]) / TAIL,
        "kinds_tail": dict(kinds.most_common()), "surplus_tail": statistics.mean(trace.surplus[tail]),
        "holder_flow": {h: mine.get(h, 0) for h in holders}, "fair_share": {h: fair.get(h, 0) for h in holders},
        "fair_gap": max(abs(mine.get(h, 0) - fair.get(h, 0)) for h in holders),
        "flips_tail": dict(trace.flips.most_common(8)), "wall_s": time.perf_counter() - started,
    }


def lossy(seed: int, ticks: int, params: FlowParams | None = None) -> dict:
    instance = generate("tight", seed)
    oracle = solve(instance).quality.flow_value
    bus = CountingBus(instance, seed=seed, params=params, network=NetworkModel(delay_ticks=1, jitter_ticks=2, loss=0.1),
                      check_every_tick=True)
    trace, (kinds, _paths) = trace_run(bus, ticks)
    tail = trace.flow[ticks - TAIL:]
    return {"seed": seed, "oracle_flow": oracle, "flow": trace.flow[-1], "end_ratio": trace.flow[-1] / max(1, oracle),
            "tail_min_ratio": min(tail) / max(1, oracle), "violations": len(bus.violations),
            "first_violations": bus.violations[:3], "declared": trace.declared,
            "path_changes_tail": sum(trace.path_change[ticks - TAIL:]),
            "messages_per_tick_tail": (trace.messages[-1] - trace.messages[ticks - TAIL - 1]) / TAIL,
            "kinds_tail": dict(kinds.most_common())}


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_fresh(rows: list[dict], ticks: int) -> None:
    n = len(rows)
    within = sum(1 for r in rows if r["stayed_from"] is not None and r["stayed_from"] <= 1000)
    cost = [r["cost_ratio"] for r in rows]
    declared = [r for r in rows if r["declared"] is not None]
    quiet = sum(1 for r in declared if r["path_changes_after"] == 0)
    print(f"| seeds | flow = max at tick {ticks} | = max from tick ≤ 1000 on | cost ratio median / p90 "
          "| declared converged | of which no path change after | assignment changes after (median / max) "
          "| messages/tick last 1000 (median / max) | surplus units at relays (median / max) "
          "| fair gap ≤ 1 | below max at a blocking flow |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    assign = [r["assign_changes_after"] for r in rows]
    msgs = [r["messages_per_tick_tail"] for r in rows]
    surplus_ = [r["surplus_tail"] for r in rows]
    print(f"| {n} | {sum(r['flow_equal'] for r in rows)}/{n} | {within}/{n} "
          f"| {statistics.median(cost):.3f} / {pct(cost, 0.9):.3f} | {len(declared)}/{n} | {quiet}/{len(declared)} "
          f"| {statistics.median(assign):.0f} / {max(assign)} | {statistics.median(msgs):.1f} / {max(msgs):.1f} "
          f"| {statistics.median(surplus_):.1f} / {max(surplus_):.1f} "
          f"| {sum(r['fair_gap'] <= 1 for r in rows)}/{n} "
          f"| {sum(r.get('blocking', False) for r in rows)}/{n - sum(r['flow_equal'] for r in rows)} |")


def report_seeds(rows: list[dict]) -> None:
    print("| seed | S | max | flow | min–max last 1000 | stayed from | declared | path / assignment changes "
          "after | last path change | cost ratio | msgs/tick | surplus | holders (fair) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        holders = ", ".join(f"{r['holder_flow'][h]} ({r['fair_share'][h]})" for h in r["holder_flow"])
        print(f"| {r['seed']} | {r['stages']} | {r['oracle_flow']} | {r['flow']} | {r['flow_min_tail']}–"
              f"{r['flow_max_tail']} | {r['stayed_from']} | {r['declared']} | {r['path_changes_after']} / "
              f"{r['assign_changes_after']} | {r['last_path_change']} | {r['cost_ratio']:.3f} "
              f"| {r['messages_per_tick_tail']:.1f} | {r['surplus_tail']:.1f} | {holders} |")


def report_lossy(rows: list[dict]) -> None:
    n = len(rows)
    end, tail = [r["end_ratio"] for r in rows], [r["tail_min_ratio"] for r in rows]
    print("| seeds | end ≥ 0.95 | min over last 1000 ≥ 0.95 | end ratio min / median | last-1000 min ratio "
          "min / median | invariant violations | messages/tick last 1000 median |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {n} | {sum(x >= 0.95 for x in end)}/{n} | {sum(x >= 0.95 for x in tail)}/{n} "
          f"| {min(end):.2f} / {statistics.median(end):.2f} | {min(tail):.2f} / {statistics.median(tail):.2f} "
          f"| {sum(r['violations'] for r in rows)} "
          f"| {statistics.median(r['messages_per_tick_tail'] for r in rows):.1f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--lossy-seeds", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=3000)
    parser.add_argument("--per-seed", action="store_true", help="also print one row per seed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--flow-param", action="append", default=[], metavar="NAME=VALUE",
                        help="a FlowParams field for every run (repeatable), e.g. loop_free_labels=true")
    args = parser.parse_args(argv)
    params = flow_params(args.flow_param)
    started = time.perf_counter()
    fresh_rows, lossy_rows = [], []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        fresh_rows.append(fresh(seed, args.ticks, params))
        print(f"fresh seed {seed}: {fresh_rows[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    for seed in range(args.first_seed, args.first_seed + args.lossy_seeds):
        lossy_rows.append(lossy(seed, args.ticks, params))
        print(f"lossy seed {seed} done", file=sys.stderr, flush=True)
    if fresh_rows:
        print(f"## tight, no loss, {args.ticks} ticks\n")
        report_fresh(fresh_rows, args.ticks)
        if args.per_seed:
            print()
            report_seeds(fresh_rows)
    if lossy_rows:
        print(f"\n## tight, 10 % loss, jitter 0-2, invariants checked every tick, {args.ticks} ticks\n")
        report_lossy(lossy_rows)
    print(f"\n(wall time {time.perf_counter() - started:.0f} s, one process)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"fresh": fresh_rows, "lossy": lossy_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
