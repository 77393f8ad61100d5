"""Where a flow run's ticks go: growth, flags, fairness hold-backs, and the units given up for fairness.

``bench_flow.py`` reports one number per run, the tick of the last routing change. This runs the same
fresh solve (``MessageBus.run``, the bench's tick budget) and notes after every tick what the ticks up to
that change were spent on: the first tick at the oracle's maximum flow, the last tick any node held
its cost moves for a blocked holder's flag (``flow_first``), the last tick a data holder held its
growth back for a poorer one (``held_back``), and every unit a holder gave up for fairness, with the want
notice it answered: the count the notice says the poorer holder routes, how many ticks before the give-up
the poorer holder said so, and what the poorer holder routed at that tick (the bus sees every node; at
max flow: "—" when the run never reached it).
A give-up is *stale* when the notice's count is two or more units below the poorer holder's own count.
Measures, asserts nothing.

    python benchmarks/flow_phases.py --family b --seeds 10 [--flow-param NAME=VALUE] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_flow import MAX_TICKS, flow_params  # benchmarks/, beside this

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.generate import FAMILIES, generate
from gwtfp2p.flow.oracle import solve

STALE_UNITS = 2  # a notice this many units below the poorer holder's own count is stale


def give_ups(bus: MessageBus, floors: dict[str, dict[str, int]]) -> list[dict]:
    """Units given up for fairness this tick. A holder that gives one up for a poorer holder raises its
    ``yield_floor`` for it to the count it answered + 1 (``floors``: each holder's floors so far); the want
    notice it answered is the one it holds for that holder (its stamp is the poorer holder's tick when it
    said so: the bus runs one clock)."""
    holders = {n.node_id: n for n in bus.nodes.values() if n.stage == 0}
    rows = []
    for name, node in sorted(holders.items()):
        now = node.fairness.yield_floor
        for poorer, floor in sorted(now.items()):
            if floors[name].get(poorer) == floor:
                continue
            want = node.residual.wants.get(poorer)
            actual = holders[poorer].routed_units() if poorer in holders else None
            rows.append({"tick": bus.now, "giver": name, "for": poorer, "giver_units": node.routed_units(),
                         "notice_units": floor - 1, "notice_age_ticks": None if want is None else bus.now - want[0],
                         "poorer_units": actual,
                         "stale": actual is not None and actual - (floor - 1) >= STALE_UNITS})
        floors[name] = dict(now)
    return rows


class PhaseBus(MessageBus):
    """The bench's bus, noting after every tick what the run spends it on (one run, no replay)."""

    def __init__(self, *args, oracle_flow: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.oracle_flow = oracle_flow
        self.at_max: int | None = None
        self.flagged: list[int] = []
        self.held: list[int] = []
        self.events: list[dict] = []
        self._floors: dict[str, dict[str, int]] = {n: {} for n, node in self.nodes.items() if node.stage == 0}

    def step(self) -> None:
        super().step()
        nodes = self.nodes.values()
        if self.at_max is None and len(self.routing()) >= self.oracle_flow:
            self.at_max = self.now
        if any(n.core.flow_first for n in nodes):
            self.flagged.append(self.now)
        if any(n.core.held_back for n in nodes):
            self.held.append(self.now)
        self.events += give_ups(self, self._floors)


def phases(family: str, seed: int, params: FlowParams) -> dict:
    """One fresh solve, its phases up to its last routing change."""
    instance = generate(family, seed)
    bus = PhaseBus(instance, seed=seed, params=params, oracle_flow=solve(instance).quality.flow_value)
    ticks = bus.run(max_ticks=MAX_TICKS).ticks_to_converge
    events = [e for e in bus.events if e["tick"] <= ticks]
    at_max = bus.at_max if bus.at_max is not None and bus.at_max <= ticks else None
    return {"family": family, "seed": seed, "ticks": ticks, "at_max_flow": at_max,
            "last_flagged": max((t for t in bus.flagged if t <= ticks), default=0),
            "last_held_back": max((t for t in bus.held if t <= ticks), default=0), "units_given_up": len(events),
            "stale_give_ups": sum(e["stale"] for e in events), "give_ups": events}


def report(rows: list[dict]) -> None:
    print("| seed | ticks | at max flow | last flagged | last held back | units given up (stale) |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['ticks']} | {r['at_max_flow'] or '—'} | {r['last_flagged']} | {r['last_held_back']} "
              f"| {r['units_given_up']} ({r['stale_give_ups']}) |")
    median = {k: statistics.median([r[k] for r in rows if r[k] is not None] or [None])
              for k in ("ticks", "at_max_flow", "last_flagged", "last_held_back")}
    print(f"\nmedian ticks {median['ticks']}, at max flow {median['at_max_flow']}, last flagged "
          f"{median['last_flagged']}, last held back {median['last_held_back']}; units given up "
          f"{sum(r['units_given_up'] for r in rows)}, stale {sum(r['stale_give_ups'] for r in rows)}")
    print("\ngive-ups: tick giver -> poorer: the giver's units after it, the notice's units (its age), the poorer's")
    for r in rows:
        for e in r["give_ups"]:
            print(f"  seed {r['seed']} tick {e['tick']}: {e['giver']} -> {e['for']}: {e['giver_units']}, notice "
                  f"{e['notice_units']} ({e['notice_age_ticks']} ticks old), poorer {e['poorer_units']}"
                  f"{'  STALE' if e['stale'] else ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="b", choices=sorted(FAMILIES))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--flow-param", action="append", default=[], metavar="NAME=VALUE",
                        help="a FlowParams field for every run (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    params = flow_params(args.flow_param)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(phases, [args.family] * len(seeds), seeds, [params] * len(seeds)))
    report(rows)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
