"""``gwtf demo`` follows the data holder's iterations with a deadline that a stuck swarm cannot extend.

A data holder that cannot close an iteration says so every few seconds (a *waiting* event). The demo
once took each of those for progress and waited for the next event anew, so a swarm stuck for good kept
it waiting until something outside killed it (a CI run: 600 s). These tests drive ``Demo.follow`` with
a scripted data holder and a fake clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from gwtf_cli.demo_cmd import ITERATION_TIMEOUT_S, Demo


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class ScriptedHolder:
    """Hands out scripted events, each after its delay on the fake clock; past the script it waits forever."""

    def __init__(self, clock: Clock, script: list[tuple[float, dict[str, Any]]]) -> None:
        self.clock = clock
        self.script = script
        self.timeouts_s: list[float] = []

    def next_event(self, names: tuple[str, ...], cursor: int, timeout_s: float) -> tuple[dict[str, Any], int]:
        self.timeouts_s.append(timeout_s)
        if cursor < len(self.script) and self.script[cursor][0] <= timeout_s:
            delay_s, event = self.script[cursor]
            self.clock.now_s += delay_s
            return event, cursor + 1
        self.clock.now_s += timeout_s
        raise TimeoutError(f"dh0: no {'/'.join(names)} event within {timeout_s:.0f} s")


def iteration(t: int) -> dict[str, Any]:
    return {"event": "iteration", "iteration": t, "loss": 5.0, "tokens_per_s": 100.0, "units": 4, "seconds": 0.5}


def waiting(reason: str) -> dict[str, Any]:
    return {"event": "waiting", "reason": reason, "time": 4e9}  # after the follow began: shown


def follow(script: list[tuple[float, dict[str, Any]]], iterations: int) -> tuple[list[dict], ScriptedHolder, list]:
    clock = Clock()
    said: list[str] = []
    holder = ScriptedHolder(clock, script)
    demo = Demo(swarm=None, say=said.append, clock=clock)  # type: ignore[arg-type]
    return demo.follow(holder, iterations), holder, said  # type: ignore[arg-type]


def test_a_swarm_that_keeps_waiting_fails_once_no_iteration_came_within_the_deadline() -> None:
    stuck = "iteration 2: 3 of 4 microbatches back; stage 2 has no live replica"
    script = [(1.0, iteration(0)), (1.0, iteration(1))] + [(5.0, waiting(stuck))] * 100
    with pytest.raises(TimeoutError) as raised:
        follow(script, 30)
    message = str(raised.value)
    assert f"no iteration within {ITERATION_TIMEOUT_S:.0f} s after iteration 1" in message
    assert stuck in message


def test_waiting_that_ends_in_an_iteration_is_progress_and_restarts_the_deadline() -> None:
    slow = [(5.0, waiting("a relay died; redoing its hop"))] * 20  # 100 s of waiting, under the deadline
    script = [(1.0, iteration(0)), *slow, (1.0, iteration(1)), *slow, (1.0, iteration(2))]
    events, holder, said = follow(script, 3)
    assert [e["iteration"] for e in events] == [0, 1, 2]
    assert max(holder.timeouts_s) <= ITERATION_TIMEOUT_S
    assert sum("waiting: a relay died" in line for line in said) == 40


def test_a_data_holder_that_says_nothing_fails_with_the_plain_timeout() -> None:
    with pytest.raises(TimeoutError, match="no iteration/waiting/training_done event within 120 s"):
        follow([(1.0, iteration(0))], 5)


def test_training_done_ends_the_follow_early() -> None:
    events, _holder, _said = follow([(1.0, iteration(0)), (1.0, {"event": "training_done"})], 5)
    assert [e["iteration"] for e in events] == [0]
