"""Shared parts of the crash-recovery integration tests (``test_churn_*.py``): the run spec, crashing a
daemon at a named point (``$GWTF_CRASH_AT``, ``gwtfp2p.daemon.testing.crashpoints``), the harness reference
and the checks every churn test makes (no lost microbatch, exactly-once counts, replicas in sync,
parity with ``PipelineHarness``), and the recovery figures the tests print.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.lifecycle.parts import load_sampler
from gwtfp2p.daemon.testing.crashpoints import CRASH_ENV
from gwtfp2p.model.harness import PipelineHarness
from tests.integration.swarm import Daemon, Swarm

TOLERANCE = 1e-4
MICROBATCHES = 4


def tiny_spec() -> RunSpec:
    return RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=11, lr=3e-3, microbatch_size=2,
                   seq_len=16, microbatches_per_dh=MICROBATCHES)


def write_spec(spec: RunSpec, path: Path) -> str:
    fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
    path.write_text(json.dumps(fields))
    return str(path)


def spawn_crashing(swarm: Swarm, name: str, crash_at: str, *args: str) -> Daemon:
    """Spawn a daemon that crashes (SIGKILL of its process group) at ``crash_at`` = POINT:STAGE:ITERATION."""
    os.environ[CRASH_ENV] = crash_at
    try:
        return swarm.spawn(name, *args)
    finally:
        del os.environ[CRASH_ENV]


def reference_losses(spec: RunSpec, n_shards: int, participants: dict[int, list[int]]) -> dict[int, dict[str, float]]:
    """The harness's loss of every microbatch ``shard/index`` per iteration, with the given shards taking part."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        harness = PipelineHarness(spec, replicas=1, data_holders=n_shards)
        samplers = {shard: load_sampler(spec, shard, n_shards) for shard in range(n_shards)}
        losses: dict[int, dict[str, float]] = {}
        for t in sorted(participants):
            batches = {d: samplers[d].iteration(t, spec.microbatches_per_dh) for d in participants[t]}
            result = harness.run_iteration(t, batches)
            losses[t] = {f"{mb.split('/')[0][1:]}/{mb.split('/')[2][1:]}": v for mb, v in result.losses.items()}
        return losses
    finally:
        torch.set_num_threads(threads)


def swarm_losses(holders: list[Daemon]) -> tuple[dict[int, dict[str, float]], dict[int, list[int]]]:
    """Every microbatch's loss ``shard/index`` per iteration, and the shards that took part in it."""
    shard_of = {d.peer_id: d.ready["shard"] for d in holders}
    losses: dict[int, dict[str, float]] = defaultdict(dict)
    participants: dict[int, list[int]] = {}
    for dh in holders:
        for event in dh.of("iteration"):
            t = event["iteration"]
            participants[t] = sorted(shard_of[p] for p in event["data_holders"] if p in shard_of)
            for key, loss in event["losses"].items():
                peer, _, index = key.split("/")
                losses[t][f"{shard_of[peer]}/{index}"] = loss
    return dict(losses), participants


def assert_parity(spec: RunSpec, holders: list[Daemon], n_shards: int) -> None:
    """Every microbatch's loss as the reference pipeline computes it."""
    losses, participants = swarm_losses(holders)
    reference = reference_losses(spec, n_shards, participants)
    for t, ref in reference.items():
        assert set(losses[t]) == set(ref), (t, sorted(losses[t]), sorted(ref))
        worst = max(abs(losses[t][k] - ref[k]) for k in ref)
        assert worst < TOLERANCE, (t, worst)


def assert_no_loss(holder: Daemon, iterations: int) -> None:
    """Every iteration of a live data holder closed with all its microbatches, each loss recorded once."""
    events = holder.of("iteration")
    assert [e["iteration"] for e in events] == list(range(iterations))
    for event in events:
        assert event["lost_microbatches"] == 0 and event["microbatches"] == MICROBATCHES, event
        assert len(event["losses"]) == MICROBATCHES


def assert_in_sync_and_counted(swarm: Swarm, holders: list[Daemon], microbatches: dict[int, int]) -> None:
    """One state hash per part and step, and every part counted each microbatch of an iteration exactly
    once (``microbatches``: iteration -> microbatches closed in it by the live data holders)."""
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    counts: dict[tuple[int, int], set[int]] = defaultdict(set)
    for daemon in swarm.daemons:
        for event in daemon.of("step"):
            hashes[(event["stage"], event["iteration"])].add(event["hash"])
            counts[(event["stage"], event["iteration"])].add(event["count"])
    for dh in holders:
        for event in dh.of("iteration"):
            hashes[(0, event["iteration"])].add(event["hash"])
            counts[(0, event["iteration"])].add(event["count"])
    assert {len(v) for v in hashes.values()} == {1}, {k: v for k, v in hashes.items() if len(v) > 1}
    wrong = {k: v for k, v in counts.items() if k[1] in microbatches and v != {microbatches[k[1]]}}
    assert not wrong, wrong


def recoveries(swarm: Swarm) -> list[dict]:
    return [e for d in swarm.daemons for e in d.of("recovery")]


def report(name: str, swarm: Swarm, crash_iteration: int, holders: list[Daemon]) -> dict:
    """Recovery figures of one run (printed; the docs quote them): extra time of the resent
    microbatches, recomputed hops, and the crash iteration's duration against the others'."""
    events = recoveries(swarm)
    resent = [e for e in events if e["kind"] in ("forward_resend", "backward_resend")]
    seconds = {e["iteration"]: e["seconds"] for e in holders[0].of("iteration")}
    others = [s for t, s in seconds.items() if t not in (0, crash_iteration)]
    figures = {
        "test": name, "crash_iteration": crash_iteration,
        "kinds": dict(sorted(Counter(e["kind"] for e in events).items())),
        "resent_microbatches": len(resent),
        "recomputed_hops": sum(e["recomputed_hops"] for e in events),
        "extra_s": sorted(round(e["extra_s"], 3) for e in resent),
        "detect_s": sorted(round(e["detect_s"], 3) for e in resent if e.get("detect_s") is not None),
        "crash_iteration_s": round(seconds.get(crash_iteration, 0.0), 3),
        "median_iteration_s": round(statistics.median(others), 3) if others else None,
    }
    print("RECOVERY", json.dumps(figures))
    return figures
