"""The step log a joiner replays: which steps it serves, its wire format (strict), and that a
replayed state is bit-identical to the replica's (same hash after every step)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.daemon.aggregation.steplog import MAX_KEPT_STEPS, StepLog, replay_capacity
from gwtfp2p.daemon.steps_wire import decode_steps, encode_steps
from gwtfp2p.daemon.wire import WireError
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.partition import split_model
from tests.unit.model.tiny import VOCAB, tiny_spec


def _log(first: int, last: int, capacity: int = 4, numel: int = 3) -> StepLog:
    log = StepLog(capacity)
    for t in range(first, last + 1):
        log.record(t, torch.full((numel,), float(t)), t % 3, f"h{t}")
    return log


def test_since_serves_contiguous_kept_steps_only():
    log = _log(0, 9)  # keeps 6..9
    assert [s.iteration for s in log.since(7)] == [7, 8, 9]
    assert [s.iteration for s in log.since(6)] == [6, 7, 8, 9]
    assert log.since(10) == []  # already there: nothing to replay
    assert log.since(5) is None and log.since(11) is None
    assert StepLog(0).since(3) is None and StepLog(4).since(0) is None
    gap = _log(0, 3)
    gap.record(7, torch.zeros(3), 1, "h7")  # we rejoined later: the older steps are not in a row
    assert gap.since(3) is None and [s.iteration for s in gap.since(7)] == [7]


def test_wire_round_trip():
    steps = _log(2, 5).since(3)
    back = decode_steps(encode_steps(steps), first_iteration=3, numel=3)
    assert [(s.iteration, s.count, s.state_hash) for s in back] == [(s.iteration, s.count, s.state_hash)
                                                                    for s in steps]
    assert all(torch.equal(a.mean_grad, b.mean_grad) for a, b in zip(back, steps, strict=True))


def test_wire_rejects_what_does_not_match():
    data = encode_steps(_log(2, 5).since(3))
    for bad, first, numel in ((data, 4, 3), (data, 3, 4), (data[:-1], 3, 3), (data + b"x", 3, 3),
                              (b"no header", 3, 3), (b"[]\n", 3, 3), (b'{"format": 2, "steps": []}\n', 3, 3),
                              (b'{"format": 1, "steps": [{"dtype": []}]}\n', 3, 3), (b"[" * 5000 + b"\n", 3, 3)):
        with pytest.raises(WireError):
            decode_steps(bad, first_iteration=first, numel=numel)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_wire_garbage_raises_only_steplog_errors(garbage: bytes):
    with contextlib.suppress(WireError):
        decode_steps(garbage, first_iteration=0, numel=2)


def test_replayed_steps_give_the_replicas_bits():
    spec = tiny_spec("gpt2", 2)
    stage = split_model(build_from_spec(spec, VOCAB), 2).stages[1]
    replica, stepper, joiner = (StageExecutor(copy.deepcopy(stage), spec, 2) for _ in range(3))
    assert replica.state_hash() == stepper.state_hash() == joiner.state_hash()  # the copies start alike
    joiner.load_state_bytes(replica.state_bytes())
    log, gen = StepLog(4), torch.Generator().manual_seed(3)
    for t in range(3):
        contributions = [GradContribution(r, torch.randint(-2**30, 2**30, (replica.numel,), generator=gen), 2, 2**30)
                         for r in "ab"]
        total = [2.0, 1e6, float("nan")][t]  # global clipping: mild, hard, a non-finite total (skipped step)
        expected = stepper.apply_step(contributions, total_sq_norm=total)  # the plain step
        mean, count = replica.reduce(contributions)
        step = replica.apply_mean(mean, count, total_sq_norm=total)  # the aggregator's path, logging the mean
        log.record(t, mean, count, step.state_hash, total)
        assert step.state_hash == expected.state_hash, (t, step, expected)  # which step, and its norms/scale
    for logged in decode_steps(encode_steps(log.since(0)), first_iteration=0, numel=replica.numel):
        result = joiner.apply_mean(logged.mean_grad, logged.count, total_sq_norm=logged.total_sq_norm)
        assert result.state_hash == logged.state_hash, (logged.iteration, result)  # a replayed step
    assert joiner.state_hash() == replica.state_hash()


def test_a_small_part_keeps_as_many_steps_as_its_budget_holds() -> None:
    """A tiny part (80k parameters) steps several times during one download: 64 MiB keep 209 steps; a 124m
    stage (~30M parameters, ~120 MiB a step) keeps ``--replay-steps``; 0 keeps none whatever the budget."""
    assert replay_capacity(4, 64 * 2**20, 80_000) == 209
    assert replay_capacity(4, 64 * 2**20, 1_000) == MAX_KEPT_STEPS
    assert replay_capacity(4, 64 * 2**20, 30_000_000) == 4
    assert replay_capacity(4, 0, 80_000) == 4
    assert replay_capacity(0, 64 * 2**20, 80_000) == 0
