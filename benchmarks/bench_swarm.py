"""Benchmark: a local swarm of real daemons vs the in-process harness, start-up time and memory.

For each configuration, one run starts a data holder and relays (``gwtf join`` processes on
127.0.0.1, explicit stages, ``--min-nodes`` so every iteration has the whole swarm), trains a few
iterations, and prints side by side:

* tokens/s of the swarm (steady state: iterations after the first two, Σ tokens / Σ period_s, the
  data holder's time from one iteration's close to the next: the relays' aggregation and steps
  included, as the harness's iterations include its steps; also over the iterations' own spans, Σ
  seconds, the figure before 7 Dec 2026) and of ``PipelineHarness`` on the same
  model, batches and replica counts in one process, and their ratio;
* seconds from process start to ``ready`` (per node: imports, DHT, transport, model, data), and
  from the last node's ``ready`` to the first microbatch (routing convergence), and from the data
  holder's start to its first microbatch;
* memory per node: RSS of the daemon process, and of its whole tree (daemon + hivemind's DHT
  process + p2pd), sampled while training.

    python benchmarks/bench_swarm.py            # gpt2-tiny and gpt2-small, 2 stages
    python benchmarks/bench_swarm.py --quick    # gpt2-tiny only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.localswarm.processes import FAST, Daemon, Swarm

MIB = 2**20


@dataclass(frozen=True)
class Case:
    preset: str
    stages: int
    replicas: int
    microbatches_per_dh: int
    microbatch_size: int
    seq_len: int
    iterations: int

    def spec(self) -> RunSpec:
        return RunSpec(model_family="gpt2", model_preset=self.preset, n_stages=self.stages, seed=0,
                       microbatch_size=self.microbatch_size, seq_len=self.seq_len,
                       microbatches_per_dh=self.microbatches_per_dh)


QUICK = [Case("tiny", 2, 1, 4, 4, 64, 12)]
DEFAULT = [*QUICK, Case("tiny", 2, 2, 8, 4, 64, 12), Case("small", 2, 1, 4, 4, 128, 8)]


def harness_tokens_per_s(spec: RunSpec, replicas: int, iterations: int) -> float:
    import torch

    from gwtfp2p.daemon.lifecycle.parts import load_sampler
    from gwtfp2p.model.harness import PipelineHarness

    torch.set_num_threads(1)  # as each daemon's compute thread
    harness = PipelineHarness(spec, replicas=replicas)
    sampler = load_sampler(spec, 0, 1)
    seconds = []
    for t in range(iterations):
        batches = {0: sampler.iteration(t, spec.microbatches_per_dh)}
        started = time.perf_counter()
        harness.run_iteration(t, batches)
        seconds.append(time.perf_counter() - started)
    tokens = spec.microbatches_per_dh * spec.microbatch_size * spec.seq_len
    return tokens * len(seconds[2:]) / sum(seconds[2:])


def node_memory(daemon: Daemon) -> tuple[int, int, int]:
    """Bytes: RSS of the daemon process, USS of the daemon, USS of its whole tree (daemon + DHT
    process + p2pd). The DHT process is forked from the daemon, so RSS would count shared pages twice."""
    try:
        root = psutil.Process(daemon.popen.pid)
        tree = [root, *root.children(recursive=True)]
        return root.memory_info().rss, root.memory_full_info().uss, sum(p.memory_full_info().uss for p in tree)
    except psutil.Error:
        return 0, 0, 0


def run_swarm(case: Case, work: Path) -> dict:
    spec = case.spec()
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({f.name: getattr(spec, f.name) for f in fields(spec)}))
    swarm = Swarm(work, common=FAST)
    n_nodes = 1 + case.stages * case.replicas
    try:
        dh = swarm.start("dh0", "--role", "data", "--run-spec", str(spec_path), "--max-iterations",
                         str(case.iterations), "--min-nodes", str(n_nodes))
        relays = [swarm.spawn_relay(f"r{k}{i}", str(k)) for k in range(1, case.stages + 1)
                  for i in range(case.replicas)]
        for relay in relays:
            relay.wait_ready()
        first = dh.wait_event("first_microbatch", 120)
        dh.wait_event("iteration", 120, iteration=1)
        memory = {d.name: node_memory(d) for d in swarm.daemons}
        dh.wait_event("training_done", 300)
        iterations = dh.of("iteration")[2:]
        tokens = sum(e["tokens"] for e in iterations)
        tokens_per_s = tokens / sum(e["period_s"] for e in iterations)
        span_tokens_per_s = tokens / sum(e["seconds"] for e in iterations)  # without what comes between
        last_ready = max(d.ready["time"] for d in swarm.daemons)
        return {"tokens_per_s": tokens_per_s, "span_tokens_per_s": span_tokens_per_s,
                "start_to_ready_s": {d.name: d.ready["time"] - d.started_at for d in swarm.daemons},
                "ready_to_first_microbatch_s": first["time"] - last_ready,
                "dh_start_to_first_microbatch_s": first["time"] - dh.started_at,
                "memory": memory}
    finally:
        swarm.close()


def report(case: Case, swarm: dict, harness: float) -> None:
    name = f"gpt2-{case.preset} S={case.stages} R={case.replicas} {case.microbatches_per_dh}x{case.microbatch_size}" \
           f"x{case.seq_len}"
    ready = swarm["start_to_ready_s"]
    print(f"\n{name}")
    span = swarm["span_tokens_per_s"]
    print(f"  tokens/s: swarm {swarm['tokens_per_s']:.0f}, harness {harness:.0f}, ratio "
          f"{swarm['tokens_per_s'] / harness:.2f} (over the iterations' own spans, without the aggregation and "
          f"steps between them: swarm {span:.0f}, ratio {span / harness:.2f})")
    print(f"  start -> ready: data holder {ready['dh0']:.1f} s, relays median "
          f"{statistics.median(v for k, v in ready.items() if k != 'dh0'):.1f} s; last ready -> first microbatch "
          f"{swarm['ready_to_first_microbatch_s']:.1f} s; data holder start -> first microbatch "
          f"{swarm['dh_start_to_first_microbatch_s']:.1f} s")
    for node, (rss, uss, tree) in swarm["memory"].items():
        print(f"  memory {node}: daemon RSS {rss / MIB:.0f} MiB (unique {uss / MIB:.0f} MiB); daemon + DHT process + "
              f"p2pd unique {tree / MIB:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="gpt2-tiny only")
    args = parser.parse_args()
    for case in QUICK if args.quick else DEFAULT:
        before = harness_tokens_per_s(case.spec(), case.replicas, case.iterations)
        with tempfile.TemporaryDirectory(prefix="bench-swarm-") as work:
            swarm = run_swarm(case, Path(work))
        after = harness_tokens_per_s(case.spec(), case.replicas, case.iterations)
        report(case, swarm, (before + after) / 2)  # the harness before and after the swarm: load drifts


if __name__ == "__main__":
    main()
