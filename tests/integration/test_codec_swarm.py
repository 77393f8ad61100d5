"""Wire codecs in a real swarm (processes on 127.0.0.1): one data holder, 2 stages × 2 relays, tiny GPT-2.

* Forwards and backwards in ``blockwise8``, exact contributions: every microbatch's loss matches the
  in-process harness with the same codecs at the same hops (``tests/codec_reference.py``) within 1e-4,
  and differs from the harness without codecs (the codec was applied); replicas stay bit-identical.
* Everything in ``blockwise8``, contributions included: replicas of every part report one state hash
  after every step (each decodes every contribution from the same bytes), and the loss falls.
* A relay crashing mid-backward with blockwise8 hops: at most one hop is redone (the kept output is
  encoded to the same bytes again) and every loss still matches the reference.
* ``gwtf demo --codec``: the JSON names the codec and its bytes per microbatch per hop, the exact
  wire size of the demo's activations (forward + backward), about 3.9× fewer than ``none``'s.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from gwtfp2p.config import RunSpec, encoded_bytes
from gwtfp2p.daemon.lifecycle.parts import load_sampler
from gwtfp2p.model.harness import PipelineHarness
from gwtfp2p.transport.compression import WireCodecs
from tests.codec_reference import with_codecs
from tests.deadlines import scaled
from tests.integration.churn_support import (
    MICROBATCHES,
    assert_in_sync_and_counted,
    assert_no_loss,
    spawn_crashing,
    tiny_spec,
)
from tests.integration.swarm import REPO_ROOT, Daemon, Swarm
from tests.integration.test_daemon_parity import write_spec

pytestmark = pytest.mark.timeout(300)
ITERATIONS = 8
TOLERANCE = 1e-4


def spec_with(forward: str, aggregate: str) -> RunSpec:
    return RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=11, lr=3e-3, microbatch_size=2,
                   seq_len=16, microbatches_per_dh=4, forward_codec=forward, backward_codec=forward,
                   aggregate_codec=aggregate)


def run_swarm(spec: RunSpec, tmp_path: Path) -> tuple[Swarm, Daemon]:
    swarm = Swarm(tmp_path)
    dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                 "--max-iterations", str(ITERATIONS), "--min-nodes", "5")
    relays = [swarm.spawn_relay(f"r{k}{c}", str(k)) for c in "ab" for k in (1, 2)]
    for relay in relays:
        relay.wait_ready()
    dh.wait_event("training_done", 200)
    return swarm, dh


def assert_replicas_in_sync(swarm: Swarm, dh: Daemon) -> None:
    """Every part's replicas stepped to one state hash after every iteration."""
    for relay in swarm.daemons[1:]:  # a relay's last step may come after the data holder's training_done
        relay.wait_event("step", 60, iteration=ITERATIONS - 1)
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    for daemon in swarm.daemons:
        for event in daemon.of("step"):
            hashes[(event["stage"], event["iteration"])].add(event["hash"])
    assert {len(v) for v in hashes.values()} == {1}, {k: v for k, v in hashes.items() if len(v) > 1}
    assert {(stage, t) for stage in (1, 2) for t in range(ITERATIONS)} <= set(hashes)
    assert {e["iteration"] for e in dh.of("iteration")} == set(range(ITERATIONS))


def assert_tokens_per_s_is_the_pace(dh: Daemon) -> None:
    """Each iteration's period runs from the previous close (the first: from its start), so it holds the
    iteration's own span and the aggregation and steps between; tokens/s is tokens over it."""
    events = dh.of("iteration")
    assert all(e["period_s"] >= e["seconds"] > 0 for e in events), events
    assert events[0]["period_s"] == events[0]["seconds"]
    assert all(e["tokens_per_s"] == pytest.approx(e["tokens"] / e["period_s"]) for e in events), events


def harness_losses(spec: RunSpec, codecs: WireCodecs | None, iterations: int = ITERATIONS,
                   replicas: tuple[int, int] = (2, 2)) -> dict[int, dict[int, float]]:
    """Per iteration, each microbatch's loss (by index) in the in-process pipeline, codecs or not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        harness = PipelineHarness(spec, replicas=list(replicas))
        if codecs is not None:
            with_codecs(harness, codecs)
        sampler = load_sampler(spec, 0, 1)
        out = {}
        for t in range(iterations):
            result = harness.run_iteration(t, {0: sampler.iteration(t, spec.microbatches_per_dh)})
            assert result.replicas_in_sync()
            out[t] = {int(mb.split("/")[2][1:]): loss for mb, loss in result.losses.items()}
        return out
    finally:
        torch.set_num_threads(threads)


def swarm_losses(dh: Daemon) -> dict[int, dict[int, float]]:
    return {e["iteration"]: {int(k.split("/")[2]): v for k, v in e["losses"].items()} for e in dh.of("iteration")}


def test_lossy_hops_match_the_harness_with_the_same_codecs(tmp_path: Path) -> None:
    spec = spec_with("blockwise8", "none")
    swarm, dh = run_swarm(spec, tmp_path)
    try:
        got = swarm_losses(dh)
        assert sorted(got) == list(range(ITERATIONS))
        assert_replicas_in_sync(swarm, dh)
    finally:
        swarm.close()
    same = harness_losses(spec, WireCodecs.of(spec))
    plain = harness_losses(spec, None)
    for t in range(ITERATIONS):
        assert set(got[t]) == set(same[t])
        assert max(abs(got[t][i] - same[t][i]) for i in same[t]) < TOLERANCE, t
    assert max(abs(got[t][i] - plain[t][i]) for t in range(1, ITERATIONS) for i in plain[t]) > TOLERANCE


def test_lossy_contributions_keep_replicas_identical(tmp_path: Path) -> None:
    swarm, dh = run_swarm(spec_with("blockwise8", "blockwise8"), tmp_path)
    try:
        losses = [e["loss"] for e in dh.of("iteration")]
        assert len(losses) == ITERATIONS and losses[-1] < losses[0]
        assert_replicas_in_sync(swarm, dh)
        assert_tokens_per_s_is_the_pace(dh)
    finally:
        swarm.close()


def test_recovery_with_lossy_hops_redoes_one_hop(tmp_path: Path) -> None:
    """A stage-1 relay SIGKILLed when the first gradient reaches it (``test_churn_relay``'s mid-backward
    crash), hops in blockwise8: the data holder resends its kept outputs, encoded to the same bytes, to the
    other replica, which recomputes one hop; no microbatch is lost and every loss matches the reference."""
    spec = dataclasses.replace(tiny_spec(), forward_codec="blockwise8", backward_codec="blockwise8")
    iterations = 6
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                     "--max-iterations", str(iterations), "--min-nodes", "4")
        # One at a time, the victim first (test_churn_relay.py): started together, r1b was once ready first, the
        # flow sent every unit through it and the victim never got a gradient to crash on.
        victim = spawn_crashing(swarm, "r1a", "exit_before_backward:1:2", "--stage", "1", *swarm.bootstrap_args(),
                                "--capacity", "2").wait_ready()
        swarm.spawn_relay("r2", "2").wait_ready()
        swarm.spawn_relay("r1b", "1", "--capacity", "2").wait_ready()
        victim.wait_event("fault", 150)
        dh.wait_event("training_done", 180)
        assert_no_loss(dh, iterations)
        resent = [e for e in dh.of("recovery") if e["kind"] in ("forward_resend", "backward_resend")]
        assert resent and all(e["recomputed_hops"] <= 1 for e in resent)
        assert_in_sync_and_counted(swarm, [dh], {t: MICROBATCHES for t in range(iterations)})
        got = swarm_losses(dh)
    finally:
        swarm.close()
    reference = harness_losses(spec, WireCodecs.of(spec), iterations, replicas=(2, 1))
    for t in range(iterations):
        assert max(abs(got[t][i] - reference[t][i]) for i in reference[t]) < TOLERANCE, t


def demo_json(codec: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "gwtf_cli.main", "demo", "--json", "--iterations", "3",
                             "--relays-per-stage", "1", "--codec", codec], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=scaled(220), start_new_session=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_demo_reports_codec_and_bytes_per_hop() -> None:
    from gwtfp2p.daemon.lifecycle.run_spec import DEMO_SPEC

    hidden = 32  # the tiny preset
    values = DEMO_SPEC.microbatch_size * DEMO_SPEC.seq_len * hidden
    summary = demo_json("blockwise8")
    assert summary["codec"] == "blockwise8" and summary["replicas_in_sync"] is True
    assert summary["bytes_per_microbatch_hop"] == 2 * encoded_bytes("blockwise8", values, 4)
    hops = 3 * DEMO_SPEC.microbatches_per_dh * 3  # iterations x microbatches x hops (data holder, 2 relays)
    assert summary["traffic"]["forwards"] >= hops and summary["traffic"]["backwards"] >= hops
    assert 3.8 < 2 * values * 4 / summary["bytes_per_microbatch_hop"] < 3.9
