"""Parity of a real swarm with the in-process harness: a data holder, 2 stages × 2 relays and a second
data holder train 20 iterations of a tiny GPT-2 and of a tiny Llama (processes on 127.0.0.1).

Per-iteration losses (and every microbatch's loss) match ``PipelineHarness`` on the same batches
within 1e-4; the replicas of every part report the same state hash after every step. The first
data holder waits for all six nodes (``--min-nodes``) so every iteration has both data holders.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.lifecycle.parts import load_sampler
from gwtfp2p.model.harness import PipelineHarness
from tests.integration.swarm import Daemon, Swarm

pytestmark = pytest.mark.timeout(240)
ITERATIONS = 20
TOLERANCE = 1e-4


def tiny_spec(family: str) -> RunSpec:
    return RunSpec(model_family=family, model_preset="tiny", n_stages=2, seed=7, lr=3e-3, microbatch_size=2,
                   seq_len=16, microbatches_per_dh=4)


def write_spec(spec: RunSpec, path: Path) -> str:
    fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
    path.write_text(json.dumps(fields))
    return str(path)


def reference_losses(spec: RunSpec, participants: dict[int, list[int]]) -> dict[int, dict[tuple[int, int], float]]:
    """Harness losses per iteration: {(shard, index): loss} with the shards that took part."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is several times faster on a busy machine
    try:
        return _reference_losses(spec, participants)
    finally:
        torch.set_num_threads(threads)


def _reference_losses(spec: RunSpec, participants: dict[int, list[int]]) -> dict[int, dict[tuple[int, int], float]]:
    harness = PipelineHarness(spec, replicas=[2, 2], data_holders=2)
    samplers = {shard: load_sampler(spec, shard, 2) for shard in (0, 1)}
    losses = {}
    for t in sorted(participants):
        batches = {d: samplers[d].iteration(t, spec.microbatches_per_dh) for d in participants[t]}
        result = harness.run_iteration(t, batches)
        assert result.replicas_in_sync()
        losses[t] = {(int(mb.split("/")[0][1:]), int(mb.split("/")[2][1:])): v for mb, v in result.losses.items()}
    return losses


def swarm_losses(holders: list[Daemon]) -> tuple[dict[int, float], dict[int, dict[tuple[int, int], float]],
                                                  dict[int, list[int]]]:
    shard_of = {d.peer_id: d.ready["shard"] for d in holders}
    means, per_mb, participants = {}, defaultdict(dict), {}
    for dh in holders:
        for event in dh.of("iteration"):
            t = event["iteration"]
            means[t] = event["loss"]
            participants[t] = sorted(shard_of[p] for p in event["data_holders"])
            for key, loss in event["losses"].items():
                peer, _, index = key.split("/")
                per_mb[t][(shard_of[peer], int(index))] = loss
    return means, dict(per_mb), participants


def assert_replicas_in_sync(swarm: Swarm, holders: list[Daemon]) -> None:
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    for daemon in swarm.daemons:
        for event in daemon.of("step"):
            hashes[(event["stage"], event["iteration"])].add(event["hash"])
    for dh in holders:
        for event in dh.of("iteration"):
            hashes[(0, event["iteration"])].add(event["hash"])
    assert {len(v) for v in hashes.values()} == {1}, {k: v for k, v in hashes.items() if len(v) > 1}
    assert {t for (_, t) in hashes} == set(range(ITERATIONS))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_swarm_matches_harness(family: str, tmp_path: Path) -> None:
    spec = tiny_spec(family)
    swarm = Swarm(tmp_path)
    try:
        dh0 = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                      "--shard", "0/2", "--max-iterations", str(ITERATIONS), "--min-nodes", "6")
        relays = [swarm.spawn_relay(f"r{k}{c}", str(k)) for c in "ab" for k in (1, 2)]
        dh1 = swarm.spawn("dh1", "--role", "data", *swarm.bootstrap_args(), "--shard", "1/2",
                          "--max-iterations", str(ITERATIONS))
        for daemon in (*relays, dh1):
            daemon.wait_ready()
        for dh in (dh0, dh1):
            dh.wait_event("training_done", 180)
        holders = [dh0, dh1]
        means, per_mb, participants = swarm_losses(holders)
        assert sorted(means) == list(range(ITERATIONS))
        assert set(map(tuple, participants.values())) == {(0, 1)}, participants
        reference = reference_losses(spec, participants)
        for t in range(ITERATIONS):
            ref = reference[t]
            assert set(per_mb[t]) == set(ref)
            assert max(abs(per_mb[t][k] - ref[k]) for k in ref) < TOLERANCE
            assert abs(means[t] - sum(ref.values()) / len(ref)) < TOLERANCE
        assert_replicas_in_sync(swarm, holders)
        assert means[ITERATIONS - 1] < means[0]
    finally:
        swarm.close()
