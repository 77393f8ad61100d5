"""Benchmark: a real swarm on rate-limited links, one run per wire codec, side by side.

    .venv/bin/python benchmarks/bench_bandwidth.py [--rate-mbit 50 10] [--codecs none float16 bfloat16 blockwise8]
        [--preset small] [--microbatch 8] [--seq-len 256] [--iterations 10] [--warmup 3]

Each node (a data holder, 2 stages × 2 relays: ``gwtf join`` processes) runs in its own network namespace
on a bridge (``tests/integration/netns/topology.py``, prefix ``bw16``); every node's uplink is capped
by ``tc tbf`` in the kernel at ``--rate-mbit``. The cap is checked first with a raw TCP transfer
between two hosts. Then, per codec (forward, backward and aggregate codec alike), the swarm trains
``--iterations`` iterations; reported: tokens/s (median of the iterations after ``--warmup``), the
iteration time (and each iteration's seconds and end), the wire bytes per microbatch per hop (the
daemons' counters), each daemon's measured compute per microbatch (``compute_ms``, what
``benchmarks/sim_vs_swarm.py`` feeds the simulator), what each host's link sent in all (the kernel's
counter, start-up and every protocol included) beside each daemon's counted payload, the CPU the host and
each daemon used over the timed iterations (``cpu``: the five daemons share this machine's cores), and the
ratios to ``none``. Needs root. Prints figures and plots them (``--from-json FILE`` re-plots a saved run);
asserts nothing. Results: docs/bandwidth.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import WIRE_CODECS, RunSpec
from gwtfp2p.localswarm.processes import FAST, Swarm
from gwtfp2p.localswarm.wire_figures import bytes_per_microbatch_hop, compute_ms, swarm_traffic
from tests.integration import host_cpu
from tests.integration.netns.rate import transfer_mbit, tx_bytes
from tests.integration.netns.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
RELAYS = (("r1a", 1), ("r1b", 1), ("r2a", 2), ("r2b", 2))
def spec_for(args: argparse.Namespace, codec: str) -> RunSpec:
    return RunSpec(model_family="gpt2", model_preset=args.preset, n_stages=2, seed=0, lr=1e-3,
                   microbatch_size=args.microbatch, seq_len=args.seq_len, microbatches_per_dh=4,
                   forward_codec=codec, backward_codec=codec, aggregate_codec=codec)


def run_swarm(topo: Topology, args: argparse.Namespace, codec: str, log_dir: Path) -> dict:
    """One training run of the swarm in the topology's namespaces; its figures."""
    spec = spec_for(args, codec)
    spec_path = log_dir / f"spec-{codec}.json"
    spec_path.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(spec).items()}))
    swarm = Swarm(log_dir, common=FAST)
    started = time.time()
    sent_before = {name: tx_bytes(topo, name) for name in topo.hosts}
    try:
        dh = swarm.spawn("dh", "--role", "data", "--host", "0.0.0.0", "--port", "4000", "--run-spec", str(spec_path),
                         "--min-nodes", "5", "--max-iterations", str(args.iterations),
                         env={"GWTF_NETNS": topo.hosts["dh"].netns}).wait_ready()
        bootstrap = next(m for m in dh.ready["maddrs"] if topo.hosts["dh"].address in m)
        relays = [swarm.spawn(name, "--stage", str(stage), "--capacity", "2", "--host", "0.0.0.0", "--port", "4001",
                              "--initial-peers", bootstrap, env={"GWTF_NETNS": topo.hosts[name].netns})
                  for name, stage in RELAYS]
        for relay in relays:
            relay.wait_ready()
        cursor = 0
        for _ in range(args.warmup):  # the timed iterations' CPU: from the warm-up's last close to the end
            _, cursor = dh.next_event(("iteration",), cursor, args.timeout_s)
        cpu_before = host_cpu.sample(swarm.daemons)
        dh.wait_event("training_done", args.timeout_s)
        cpu = host_cpu.cpu_between(cpu_before, host_cpu.sample(swarm.daemons))
        events = dh.of("iteration")
        sent = swarm_traffic(swarm.daemons, time.time())
        timed = events[args.warmup:] or events
        measured_from = timed[0]["time"] - timed[0]["seconds"]  # the start of the first timed iteration
        compute = compute_ms(swarm.daemons, measured_from)
        link_sent = {name: tx_bytes(topo, name) - before for name, before in sent_before.items()}
        payload = {d.name: swarm_traffic([d], 0.0) for d in swarm.daemons}  # their reports just read: no wait
    finally:
        swarm.close()
    return {"codec": codec, "iterations": len(events),
            "tokens_per_s": statistics.median(e["tokens_per_s"] for e in timed),
            "iteration_s": statistics.median(e["seconds"] for e in timed), "losses": [e["loss"] for e in events],
            "iteration_seconds": [e["seconds"] for e in events],
            "iteration_ended_s": [e["time"] - started for e in events],
            "bytes_per_microbatch_hop": bytes_per_microbatch_hop(sent), "traffic": sent,
            "compute_ms": compute, "link_tx_bytes": link_sent, "traffic_by_node": payload,
            "cpu": {**cpu, "iterations": len(events) - args.warmup},
            "wall_s": time.time() - started}


def report(rate: float, measured: float, rows: list[dict]) -> None:
    base = next((r for r in rows if r["codec"] == "none"), rows[0])
    print(f"\nuplinks capped at {rate:g} Mbit/s (tc tbf; a raw TCP transfer measured {measured:.1f} Mbit/s)")
    print(f"{'codec':<11}{'bytes/hop':>12}{'byte ratio':>12}{'tokens/s':>10}{'speed-up':>10}{'iteration s':>13}"
          f"{'agg MiB':>9}{'host CPU':>10}")
    for r in rows:
        per_hop = r["bytes_per_microbatch_hop"] or 0.0
        ratio = (base["bytes_per_microbatch_hop"] or 0.0) / per_hop if per_hop else 0.0
        agg = r["traffic"].get("aggregation_bytes", 0) / 2**20
        print(f"{r['codec']:<11}{per_hop:>12,.0f}{ratio:>11.2f}x{r['tokens_per_s']:>10.0f}"
              f"{r['tokens_per_s'] / base['tokens_per_s']:>9.2f}x{r['iteration_s']:>13.2f}{agg:>9.1f}"
              f"{100 * r['cpu']['host_utilization']:>9.0f}%")


def plot(results: list[dict], path: Path) -> None:
    """Tokens/s per codec at each rate (bars), each bar labelled with its speed-up and byte ratio vs ``none``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = result["runs"]
        base = next((r for r in rows if r["codec"] == "none"), rows[0])
        bars = ax.bar([r["codec"] for r in rows], [r["tokens_per_s"] for r in rows], color="tab:blue")
        for bar, r in zip(bars, rows, strict=True):
            ratio = base["bytes_per_microbatch_hop"] / r["bytes_per_microbatch_hop"]
            ax.annotate(f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x\n(bytes {ratio:.2f}x)",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_title(f"uplinks capped at {result['rate_mbit']:g} Mbit/s (measured {result['measured_mbit']:.1f})",
                     fontsize=9)
        ax.set_ylabel("tokens/s (median)")
        ax.set_ylim(0, 1.3 * max(r["tokens_per_s"] for r in rows))
    fig.suptitle("A real swarm per wire codec\n(data holder + 2 stages x 2 relays, gwtf join processes)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mbit", type=float, nargs="+", default=[50.0])
    parser.add_argument("--codecs", nargs="+", default=list(WIRE_CODECS), choices=WIRE_CODECS)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "data" / "bench_bandwidth.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "bandwidth-swarm.png")
    parser.add_argument("--from-json", type=Path, help="only plot the results saved in this file; run nothing")
    args = parser.parse_args()
    if args.from_json:
        plot(json.loads(args.from_json.read_text())["results"], args.plot)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="bw16-") as tmp, Topology(prefix=f"bw16{uuid.uuid4().hex[:5]}") as topo:
        for name in ("dh", *(r for r, _ in RELAYS)):
            topo.public_host(name)
        for rate in args.rate_mbit:
            for name in topo.hosts:
                topo.shape(name, f"{rate:g}mbit")
            measured = transfer_mbit(topo, "dh", "r1a")
            rows = []
            for codec in args.codecs:
                rows.append(run_swarm(topo, args, codec, Path(tmp)))
                print(f"{rate:g} Mbit/s {codec}: {rows[-1]['tokens_per_s']:.0f} tokens/s", flush=True)
            report(rate, measured, rows)
            results.append({"rate_mbit": rate, "measured_mbit": measured, "runs": rows})
            save(args, results)  # after every rate: a run stopped later keeps what it measured
    plot(results, args.plot)


def save(args: argparse.Namespace, results: list[dict]) -> None:
    setup = {k: v for k, v in vars(args).items() if k not in ("out", "plot", "from_json")}
    args.out.write_text(json.dumps({"setup": setup, "spec": dataclasses.asdict(spec_for(args, "none")),
                                    "results": results}, indent=1, default=str))
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
