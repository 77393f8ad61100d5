"""Benchmark: the same swarm with its relays on the internet (direct) or behind home NATs (relayed).

    .venv/bin/python benchmarks/bench_nat.py [--rate-mbit 20] [--preset small] [--microbatch 8]
        [--seq-len 128] [--iterations 30] [--warmup 5] [--repeats 2]

A data holder on the "internet" and one relay per stage of a 2-stage run, each ``gwtf join`` in its own
network namespace (``tests/integration/netns/topology.py``). *direct*: both relays are public hosts.
*relayed*: stage 1's relay sits behind a home NAT router (iptables MASQUERADE, nothing in): its
reachability check finds it ``relayed``; the data holder's forwards and stage 2's backwards reach it over
the connections it opened (as in ``tests/integration/test_netns_nat.py``). Both relays behind NATs (stage
1 to stage 2 only through a circuit relayed by a third peer's p2pd) did not train on 2 Dec 2026: every
forward failed with "Connect failed" (docs/networking.md), so it is not a setup here. Every
host's link is capped at ``--rate-mbit`` both ways with ``tc tbf``. Reported, side by side per run:
each relay's process start to ``ready`` (its reachability check included: the ``reachability`` event's
seconds) and tokens/s (median of the data holder's iterations after ``--warmup``), and the ratios. Needs
root. Prints figures; asserts nothing. Results: docs/networking.md, docs/data/bench_nat.json,
docs/img/networking-join.png and docs/img/networking-throughput.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.localswarm.processes import FAST, Swarm
from tests.integration.netns.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
SETUPS = ("direct", "relayed")


def build(kind: str, rate_mbit: float) -> Topology:
    topo = Topology(prefix=f"nat13{uuid.uuid4().hex[:4]}").__enter__()
    topo.public_host("dh")
    (topo.public_host if kind == "direct" else topo.home_host)("r1")
    topo.public_host("r2")
    for name in topo.hosts:
        topo.shape(name, f"{rate_mbit:g}mbit")
        topo.shape_downlink(name, f"{rate_mbit:g}mbit")
    return topo


def run(kind: str, args: argparse.Namespace, log_dir: Path) -> dict:
    """One training run of the swarm in ``kind``'s topology; its figures."""
    spec = {"model_family": "gpt2", "model_preset": args.preset, "n_stages": 2, "seed": 0, "lr": 1e-3,
            "microbatch_size": args.microbatch, "seq_len": args.seq_len, "microbatches_per_dh": 4}
    spec_path = log_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    topo = build(kind, args.rate_mbit)
    swarm = Swarm(log_dir, common=FAST)
    try:
        dh_host = topo.hosts["dh"]
        dh = swarm.spawn("dh", "--role", "data", "--host", "0.0.0.0", "--port", "4000", "--run-spec", str(spec_path),
                         "--min-nodes", "3", "--max-iterations", str(args.iterations),
                         env={"GWTF_NETNS": dh_host.netns}).wait_ready(180)
        bootstrap = next(m for m in dh.ready["maddrs"] if dh_host.address in m)
        relays = [swarm.spawn(name, "--stage", str(stage), "--host", "0.0.0.0", "--port", "4001",
                              "--initial-peers", bootstrap, env={"GWTF_NETNS": topo.hosts[name].netns})
                  for name, stage in (("r1", 1), ("r2", 2))]
        for relay in relays:
            relay.wait_ready(180)
        dh.wait_event("training_done", args.timeout_s)
        events = dh.of("iteration")
    finally:
        swarm.close()
        topo.close()
    timed = events[args.warmup:] or events
    return {"setup": kind, "tokens_per_s": statistics.median(e["tokens_per_s"] for e in timed),
            "iteration_s": statistics.median(e["seconds"] for e in timed),
            "lost": sum(e["lost_microbatches"] for e in events),
            "relays": [{"name": r.name, "ready_s": round(r.ready["time"] - r.started_at, 2),
                        "verdict": r.of("reachability")[0]["verdict"],
                        "check_s": r.of("reachability")[0]["seconds"],
                        "relayed_maddr": any("/p2p-circuit/" in m for m in r.ready["maddrs"])} for r in relays]}


def report(rows: list[dict]) -> None:
    print(f"\n{'setup':<9}{'relay':<6}{'verdict':<9}{'check s':>8}{'start->ready s':>16}{'tokens/s':>10}"
          f"{'iteration s':>13}{'lost':>6}")
    for r in rows:
        for i, relay in enumerate(r["relays"]):
            tokens = f"{r['tokens_per_s']:>10.0f}{r['iteration_s']:>13.2f}{r['lost']:>6}" if i == 0 else ""
            print(f"{r['setup']:<9}{relay['name']:<6}{relay['verdict']:<9}{relay['check_s']:>8.2f}"
                  f"{relay['ready_s']:>16.1f}{tokens}")
    by = {kind: [r for r in rows if r["setup"] == kind] for kind in SETUPS}
    if all(by.values()):
        tok = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in by.items()}
        ready = {k: statistics.median(x["ready_s"] for r in v for x in r["relays"]) for k, v in by.items()}
        print(f"\nrelayed / direct: tokens/s {tok['relayed'] / tok['direct']:.2f}x, "
              f"start->ready {ready['relayed'] / ready['direct']:.2f}x (medians)")


def plot(rows: list[dict], rate_mbit: float, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"direct": "#4c72b0", "relayed": "#dd8452"}
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for k, kind in enumerate(SETUPS):
        ready = [x["ready_s"] for r in rows if r["setup"] == kind for x in r["relays"]]
        check = [x["check_s"] for r in rows if r["setup"] == kind for x in r["relays"]]
        ax.scatter([k - 0.08] * len(ready), ready, color=colors[kind], label=f"{kind}: start -> ready")
        ax.scatter([k + 0.08] * len(check), check, color=colors[kind], marker="x", label=f"{kind}: reachability check")
    ax.set_xticks(range(len(SETUPS)), SETUPS)
    ax.set_ylabel("seconds")
    ax.set_title("Relay join: process start to ready (each relay of each run)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out_dir / "networking-join.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for k, kind in enumerate(SETUPS):
        values = [r["tokens_per_s"] for r in rows if r["setup"] == kind]
        ax.bar(k, statistics.median(values) if values else 0, color=colors[kind], alpha=0.6)
        ax.scatter([k] * len(values), values, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(SETUPS)), SETUPS)
    ax.set_ylabel("tokens/s (median iteration)")
    ax.set_title(f"A relay behind a NAT vs direct (links {rate_mbit:g} Mbit/s)")
    fig.tight_layout()
    fig.savefig(out_dir / "networking-throughput.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mbit", type=float, default=20.0)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "data" / "bench_nat.json")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="nat13-") as tmp:
        for repeat in range(args.repeats):
            for kind in SETUPS:  # interleaved: both setups see the same machine load
                rows.append(run(kind, args, Path(tmp)))
                print(f"run {repeat + 1} {kind}: {rows[-1]['tokens_per_s']:.0f} tokens/s, relays ready after "
                      f"{[x['ready_s'] for x in rows[-1]['relays']]} s", flush=True)
    report(rows)
    setup = {k: str(v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"setup": setup, "wall_s": round(time.time() - started), "runs": rows}, indent=1))
    plot(rows, args.rate_mbit, args.img)
    print(f"wrote {args.out} and the plots in {args.img}")


if __name__ == "__main__":
    main()
