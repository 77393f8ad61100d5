"""Exact training, judged end to end: a real local swarm (or ``gwtf demo --json``) against one process
trained on plain transformers classes (``tests/unit/model/plain_reference.py``: none of the project's
model code; only the token windows come from the data holders' own sampler, as the issue asks).

Shared by ``test_exact_training.py`` and ``benchmarks/bench_exact_swarm.py``: ``run_swarm`` starts data
holders and relays and collects every microbatch's loss, every iteration's swarm loss and clip factor;
``plain_run`` trains the single process on the same windows; ``compare`` puts them side by side.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gwtf_cli.demo_cmd import in_sync
from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.lifecycle.parts import load_sampler
from gwtfp2p.model.losssum import LossSum
from gwtfp2p.model.tokenizer import ByteTokenizer
from tests.integration.churn_support import write_spec
from tests.integration.swarm import REPO_ROOT, Daemon, Swarm
from tests.unit.model.plain_reference import PlainTrainer, plain_model

Key = tuple[int, int]  # (data holder's shard, microbatch index)


def exact_spec(family: str, *, lr: float = 3e-3, grad_clip: float = 1.0, screen_factor: float | None = None) -> RunSpec:
    """Tiny presets, 2 stages, 4 microbatches of 2 x 16 tokens per data holder, global clipping; the
    robust-aggregation screen as the run spec's default unless ``screen_factor`` is given (0: off)."""
    screen = {} if screen_factor is None else {"screen_factor": screen_factor}
    return RunSpec(model_family=family, model_preset="tiny", n_stages=2, seed=7, lr=lr, grad_clip=grad_clip,
                   microbatch_size=2, seq_len=16, microbatches_per_dh=4, clip_mode="global", **screen)


@dataclass
class Training:
    """One training run's figures per iteration: every microbatch's loss, the mean, whether it clipped."""

    losses: dict[int, dict[Key, float]] = field(default_factory=lambda: defaultdict(dict))
    means: dict[int, float] = field(default_factory=dict)
    clipped: set[int] = field(default_factory=set)  # iterations whose step the global norm scaled down
    holders: dict[int, list[int]] = field(default_factory=dict)  # the shards that took part


def swarm_training(holders: list[Daemon]) -> Training:
    """The figures the data holders reported in their ``iteration`` events."""
    shard_of = {d.peer_id: d.ready["shard"] for d in holders}
    run = Training()
    for dh in holders:
        for event in dh.of("iteration"):
            t = event["iteration"]
            run.means[t] = event["loss"]
            if event["clip_scale"] < 1.0:
                run.clipped.add(t)
            run.holders[t] = sorted(shard_of[p] for p in event["data_holders"])
            for key, loss in event["losses"].items():
                peer, _, index = key.split("/")
                run.losses[t][(shard_of[peer], int(index))] = loss
    return run


def run_swarm(spec: RunSpec, iterations: int, work: Path, *, data_holders: int = 2,
              replicas: tuple[int, ...] = (2, 1), timeout_s: float = 600.0) -> tuple[Training, bool]:
    """Train ``iterations`` on a local swarm (every data holder in every iteration: ``--min-nodes``);
    the figures and whether every part's replicas stayed in sync."""
    swarm = Swarm(work)
    n_nodes = data_holders + sum(replicas)
    common = ("--max-iterations", str(iterations))
    try:
        holders = [swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, work / "spec.json"), "--shard",
                                           f"0/{data_holders}", "--min-nodes", str(n_nodes), *common)]
        holders += [swarm.spawn(f"dh{d}", "--role", "data", *swarm.bootstrap_args(), "--shard", f"{d}/{data_holders}",
                                *common) for d in range(1, data_holders)]
        relays = [swarm.spawn_relay(f"r{k}{i}", str(k)) for k, n in enumerate(replicas, start=1) for i in range(n)]
        for daemon in (*holders[1:], *relays):
            daemon.wait_ready()
        for dh in holders:
            dh.wait_event("training_done", timeout_s)
        for relay in relays:  # the last step of every relay, for the hash comparison
            relay.wait_event("step", 60, iteration=iterations - 1)
        return swarm_training(holders), in_sync(swarm.daemons)
    finally:
        swarm.close()


KEPT_LOGS = re.compile(r"^gwtf demo: logs kept in (\S+)$", re.MULTILINE)


def demo_losses(*args: str, timeout_s: float = 600.0, keep_logs: bool = False) -> dict[str, Any]:
    """``gwtf demo --json ARGS``: its summary (one loss per iteration, ``churn`` with --churn). The daemons log
    at INFO (``--keep-logs``): a failed run's error names their directory, a passing run's is removed (with
    ``keep_logs``: kept, and named in the summary's ``logs``; the caller removes it)."""
    result = subprocess.run([sys.executable, "-m", "gwtf_cli.main", "demo", "--json", "--keep-logs", *args],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    kept = KEPT_LOGS.search(result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"gwtf demo {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    if kept is not None and keep_logs:
        summary["logs"] = kept.group(1)
    elif kept is not None:
        shutil.rmtree(kept.group(1), ignore_errors=True)
    return summary


def plain_run(spec: RunSpec, iterations: int, shards: int, gradient: str = "exact") -> Training:
    """The single process on plain transformers classes, on the data holders' windows (every shard of
    ``shards`` in every iteration), with the exact arithmetic (or ``"conventional"``: float32 ``.grad``,
    ``clip_grad_norm_``); one torch thread, as the daemons."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samplers = [load_sampler(spec, shard, shards) for shard in range(shards)]
        trainer = PlainTrainer(plain_model(spec.model_family, ByteTokenizer.vocab_size, spec.seed), lr=spec.lr,
                               betas=(spec.beta1, spec.beta2), eps=spec.adam_eps, weight_decay=spec.weight_decay,
                               max_norm=spec.grad_clip, gradient=gradient)
        run = Training()
        n = spec.microbatches_per_dh
        for t in range(iterations):
            batches = [mb for sampler in samplers for mb in sampler.iteration(t, n)]
            clipped_before = trainer.clipped
            losses = trainer.step(batches)
            run.losses[t] = {(i // n, i % n): loss for i, loss in enumerate(losses)}
            run.means[t] = LossSum.of(losses).mean
            if trainer.clipped > clipped_before:
                run.clipped.add(t)
            run.holders[t] = list(range(shards))
        return run
    finally:
        torch.set_num_threads(threads)


def compare(swarm: Training, plain: Training, iterations: range) -> dict[str, Any]:
    """Side by side over ``iterations``: the largest |Δ| of a microbatch's loss and of an iteration's mean,
    how many iterations are bitwise equal, and the first that is not."""
    worst_mb = worst_mean = 0.0
    equal, first_diff = 0, None
    for t in iterations:
        mine, theirs = swarm.losses.get(t, {}), plain.losses[t]
        if set(mine) != set(theirs):
            raise AssertionError(f"iteration {t}: losses of {sorted(mine)}, the reference has {sorted(theirs)}")
        deltas = [abs(mine[k] - theirs[k]) for k in theirs] + [abs(swarm.means[t] - plain.means[t])]
        worst_mb, worst_mean = max(worst_mb, *deltas[:-1]), max(worst_mean, deltas[-1])
        if all(mine[k] == theirs[k] for k in theirs) and swarm.means[t] == plain.means[t]:
            equal += 1
        elif first_diff is None:
            first_diff = t
    return {"iterations": len(iterations), "bitwise_equal": equal, "first_difference": first_diff,
            "max_dloss_microbatch": worst_mb, "max_dloss_mean": worst_mean}
