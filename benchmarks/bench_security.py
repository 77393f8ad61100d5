"""Benchmark: what issue 14's defences cost, side by side in one run.

1. Signatures and verification on vs off (``gwtf join --no-signatures`` on every node): a local swarm
   of real daemons (a data holder, two stages of two replicas, tiny GPT-2) trains the same iterations
   both ways, alternating runs (the machine is shared: load drifts); printed: the data holder's
   steady-state tokens/s (iterations after the first three: Σ tokens / Σ seconds) and join times
   (process start -> ``ready`` of each relay, and a relay started into the trained swarm, whose join
   downloads and verifies a state), with the ratio on/off.
2. Two-replica output checks per fraction (``--cross-check F`` on the data holder, signatures on):
   tokens/s and the checks done per run, against F = 0.
3. The primitives, in process: sealing and validating a node record, signing and checking a
   contribution (sha256 of the sum + signature) for the tiny and small presets.

    python benchmarks/bench_security.py                 # everything (about 15 min on 2 busy cores)
    python benchmarks/bench_security.py --quick         # one run each way, fractions 0 and 0.3
    python benchmarks/bench_security.py --replot FILE   # redraw the plot from saved results

Results go to docs/data/bench_security.json and the plot to docs/img/security-overhead.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.localswarm.processes import FAST, Swarm

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "data" / "bench_security.json"
PLOT = REPO / "docs" / "img" / "security-overhead.png"
SPEC = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=0, microbatch_size=4, seq_len=64,
               microbatches_per_dh=8)
ITERATIONS = 14
WARMUP = 3


def run_swarm(work: Path, *, signatures: bool, cross_check: float, joiner: bool) -> dict:
    """One swarm, trained ``ITERATIONS`` iterations; tokens/s, join times, checks done."""
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({f.name: getattr(SPEC, f.name) for f in fields(SPEC)}))
    common = (*FAST, *(() if signatures else ("--no-signatures",)))
    swarm = Swarm(work, common=common)
    try:
        dh = swarm.start("dh", "--role", "data", "--run-spec", str(spec_path), "--min-nodes", "5",
                         "--max-iterations", str(ITERATIONS + (6 if joiner else 0)), "--cross-check", str(cross_check))
        relays = [swarm.spawn_relay(f"r{k}{c}", str(k), "--capacity", "8") for k in (1, 2) for c in "ab"]
        for relay in relays:
            relay.wait_ready()
        dh.wait_event("iteration", 300, iteration=ITERATIONS - 1)
        steady = [e for e in dh.of("iteration") if WARMUP <= e["iteration"] < ITERATIONS]
        result = {"tokens_per_s": sum(e["tokens"] for e in steady) / sum(e["seconds"] for e in steady),
                  "relay_join_s": statistics.median(r.ready["time"] - r.started_at for r in relays),
                  "checks": len(dh.of("cross_check")),
                  "check_verdicts": sorted({e["verdict"] for e in dh.of("cross_check")})}
        if joiner:
            late = swarm.spawn_relay("late", "2", "--capacity", "8").wait_ready(180)
            result["late_join_s"] = late.ready["time"] - late.started_at
            result["late_download_s"] = late.ready["download_s"]
        return result
    finally:
        swarm.close()


def primitives() -> dict[str, float]:
    """Milliseconds per operation (median of repeats), in this process."""
    import torch

    from gwtfp2p.daemon.aggregation.admission import contribution_message, grad_digest
    from gwtfp2p.daemon.lifecycle.parts import build_part
    from gwtfp2p.dht.identity import NodeKey, verify
    from gwtfp2p.dht.records import NodeRecord, encode_record
    from gwtfp2p.dht.sealed import open_entries, seal

    key = NodeKey.generate("rsa")
    record = NodeRecord(run_id="0" * 16, peer_id=key.peer_id, role="relay", stage=1, state="online")
    payload, out = encode_record(record), {}

    def timed(name: str, fn, repeats: int = 50) -> None:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        out[name] = statistics.median(samples) * 1000

    class Entry:
        value = seal(key, "gwtf/x/nodes", key.peer_id, 1e9, payload)

    timed("seal a node record (RSA-2048 signature)", lambda: seal(key, "gwtf/x/nodes", key.peer_id, 1e9, payload))
    timed("open + check a sealed node record", lambda: open_entries({key.peer_id: Entry()}, "gwtf/x/nodes"))
    for preset in ("tiny", "small"):
        part = build_part(RunSpec(model_family="gpt2", model_preset=preset, n_stages=2), 1, "cpu")
        grad = torch.randint(-2**40, 2**40, (part.numel,), dtype=torch.int64)
        message = contribution_message(1, 7, key.peer_id, 4, 2**41, asyncio.run(grad_digest(grad)), {})
        signature = key.sign(message)
        timed(f"sha256 of a {preset} stage's contribution ({part.numel * 8 / 2**20:.1f} MiB)",
              lambda g=grad: asyncio.run(grad_digest(g)), repeats=10)
        timed(f"sign a {preset} contribution (after its hash)", lambda m=message: key.sign(m), repeats=20)
        timed(f"verify a {preset} contribution (after its hash)",
              lambda m=message, s=signature: verify(key.peer_id, key.public_key_proto, m, s), repeats=20)
    return out


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    modes = results["signatures"]
    for i, mode in enumerate(("on", "off")):
        values = [r["tokens_per_s"] for r in modes[mode]]
        left.scatter([i] * len(values), values, color="C0" if mode == "on" else "C1")
        left.bar(i, statistics.median(values), alpha=0.3, color="C0" if mode == "on" else "C1")
    left.set_xticks([0, 1], ["signatures on", "signatures off"])
    left.set_ylabel("tokens/s (data holder, steady state)")
    left.set_title("signing and verification")
    fractions = sorted(results["cross_check"], key=float)
    medians = [statistics.median(r["tokens_per_s"] for r in results["cross_check"][f]) for f in fractions]
    right.plot([float(f) for f in fractions], medians, "o-")
    for f in fractions:
        right.scatter([float(f)] * len(results["cross_check"][f]),
                      [r["tokens_per_s"] for r in results["cross_check"][f]], color="C0", alpha=0.4)
    right.set_xlabel("fraction of microbatches cross-checked")
    right.set_ylabel("tokens/s")
    right.set_title("two-replica output checks")
    right.set_ylim(bottom=0)
    left.set_ylim(bottom=0)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def report(results: dict) -> None:
    on, off = (results["signatures"][m] for m in ("on", "off"))
    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)
    print("\nsignatures and verification (median of runs; ratio on/off)")
    for key, what in (("tokens_per_s", "tokens/s"), ("relay_join_s", "relay start -> ready (s)"),
                      ("late_join_s", "late relay start -> ready (s, state downloaded and verified)")):
        a, b = med(on, key), med(off, key)
        print(f"  {what:58s} on {a:9.2f}   off {b:9.2f}   ratio {a / b:.3f}")
    base = statistics.median(r["tokens_per_s"] for r in results["cross_check"]["0.0"])
    print("\ntwo-replica output checks (signatures on)")
    for fraction in sorted(results["cross_check"], key=float):
        runs = results["cross_check"][fraction]
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        verdicts = sorted({v for r in runs for v in r["check_verdicts"]})
        print(f"  fraction {float(fraction):4.2f}: tokens/s {tps:9.1f}  ratio to none {tps / base:.3f}  checks per run "
              f"{statistics.median(r['checks'] for r in runs):.0f}  verdicts {verdicts}")
    print("\nprimitives (ms, median)")
    for name, ms in results["primitives"].items():
        print(f"  {name:60s} {ms:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--replot", type=Path)
    args = parser.parse_args()
    if args.replot:
        results = json.loads(args.replot.read_text())
        report(results)
        plot(results)
        return
    rounds, fractions = (1, (0.0, 0.3)) if args.quick else (3, (0.0, 0.1, 0.3, 1.0))
    results: dict = {"signatures": {"on": [], "off": []}, "cross_check": {str(f): [] for f in fractions},
                     "setup": {"spec": {f.name: getattr(SPEC, f.name) for f in fields(SPEC)},
                               "iterations": ITERATIONS, "warmup": WARMUP, "rounds": rounds}}
    for round_ in range(rounds):
        for mode in (("on", "off") if round_ % 2 == 0 else ("off", "on")):  # alternate: load drifts
            with tempfile.TemporaryDirectory(prefix="bench-security-") as work:
                results["signatures"][mode].append(run_swarm(Path(work), signatures=mode == "on", cross_check=0.0,
                                                             joiner=True))
            print(f"round {round_} signatures {mode}: {results['signatures'][mode][-1]}", flush=True)
        for fraction in fractions:
            with tempfile.TemporaryDirectory(prefix="bench-security-") as work:
                results["cross_check"][str(fraction)].append(run_swarm(Path(work), signatures=True,
                                                                       cross_check=fraction, joiner=False))
            print(f"round {round_} cross-check {fraction}: {results['cross_check'][str(fraction)][-1]}", flush=True)
    results["primitives"] = primitives()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    report(results)
    plot(results)


if __name__ == "__main__":
    main()
