"""The chaos run's checks and per-crash figures (``gwtfp2p.localswarm.chaos_figures``) on hand-made events."""

from __future__ import annotations

from typing import Any

from gwtfp2p.localswarm.chaos_figures import check_holders, check_parts, crash_figures, p95
from gwtfp2p.localswarm.chaos_run import step_trail

DH = "QmHolder"


class Recorded:
    """A daemon reduced to what the figures read: a name and its events."""

    def __init__(self, name: str, events: list[dict[str, Any]]) -> None:
        self.name = name
        self.events = events

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]


def holder(walls: list[float], microbatches: int = 2) -> Recorded:
    events: list[dict[str, Any]] = [{"event": "ready", "peer_id": DH, "from_iteration": 0, "stage": 0}]
    now = 100.0
    for t, wall in enumerate(walls):
        now += wall
        events.append({"event": "iteration", "iteration": t, "time": now, "seconds": wall, "lost_microbatches": 0,
                       "microbatches": microbatches, "swarm_microbatches": microbatches, "hash": f"h0-{t}",
                       "count": microbatches, "losses": {f"{DH}/{t}/{i}": 5.0 - t for i in range(microbatches)}})
    return Recorded("dh0", events)


def relay(name: str, steps: dict[int, tuple[str, int]], peer: str = "", stage: int = 1) -> Recorded:
    events: list[dict[str, Any]] = [{"event": "ready", "peer_id": peer or name, "from_iteration": min(steps),
                                     "stage": stage}]
    events += [{"event": "step", "stage": stage, "iteration": t, "hash": h, "count": c, "dropped": []}
               for t, (h, c) in sorted(steps.items())]
    return Recorded(name, events)


def crash(victim: str, iteration: int, index: int = 0, stage: int = 1) -> dict[str, Any]:
    return {"index": index, "victim": victim, "peer_id": victim, "stage": stage, "iteration": iteration,
            "mode": "random"}


def test_p95_is_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 21)]) == 19.0


def test_holder_with_a_missing_loss_is_reported() -> None:
    dh = holder([1.0, 1.0, 1.0])
    assert check_holders([dh], 2, 3) == []
    del dh.events[2]["losses"][f"{DH}/1/0"]
    assert any("iteration 1" in p for p in check_holders([dh], 2, 3))


def test_survivors_must_agree_but_a_victims_dying_step_may_differ() -> None:
    dh = holder([1.0, 1.0, 1.0])
    survivor = relay("a", {0: ("x0", 2), 1: ("x1", 1), 2: ("x2", 2)})
    victim = relay("v", {0: ("x0", 2), 1: ("lonely", 2)})  # decided alone just before it died
    problems, parts = check_parts([dh, survivor, victim], [dh], [crash("v", 1)], 1, 2, 3)
    assert problems == [] and parts == {"dying_steps": 1, "dying_steps_diverged": 1,
                                        "contributions_lost_with_dead_replicas": 1, "lossy_iterations": [1]}
    other = relay("b", {0: ("x0", 2), 1: ("x1", 1), 2: ("other", 2)})
    problems, _ = check_parts([dh, survivor, victim, other], [dh], [crash("v", 1)], 1, 2, 3)
    assert problems == ["stage 1 iteration 2: replicas disagree ['other', 'x2']"]


def test_a_short_count_needs_a_dead_replica_and_a_double_count_is_always_wrong() -> None:
    dh = holder([1.0, 1.0])
    problems, _ = check_parts([dh, relay("a", {0: ("x0", 1), 1: ("x1", 2)})], [dh], [], 1, 2, 2)
    assert problems == ["stage 1 iteration 0: counted [1] of 2 microbatches"]
    problems, _ = check_parts([dh, relay("a", {0: ("x0", 3), 1: ("x1", 2)})], [dh], [], 1, 2, 2)
    assert problems == ["stage 1 iteration 0: counted [3] of 2 microbatches"]


def test_extra_time_is_shared_by_the_crashes_of_an_iteration() -> None:
    dh = holder([5.0, 1.0, 1.0, 4.0, 1.0, 1.0])  # iteration 0 (warm-up) is no baseline
    crashes = [crash("v", 3, 0), crash("w", 3, 1)]
    figures = crash_figures(crashes, dh, [dh], 6)
    assert figures["clean_iteration_s"] == 1.0
    assert [c["extra_s"] for c in figures["per_crash"]] == [1.5, 1.5]
    assert figures["recomputed_hops_per_crash"] == 0.0 and figures["affected_microbatches"] == 0


def test_recomputed_hops_are_attributed_to_the_crash_that_lost_the_hop() -> None:
    dh = holder([1.0, 1.0, 1.0, 3.0])
    recoveries = Recorded("r", [{"event": "recovery", "kind": "backward_resend", "lost": "v", "recomputed_hops": 1,
                                 "extra_s": 0.5, "detect_s": 0.2, "microbatch": f"{DH}/3/{i}"} for i in range(2)])
    figures = crash_figures([crash("v", 3)], dh, [dh, recoveries], 4)
    assert figures["recomputed_hops"] == 2 and figures["affected_microbatches"] == 2
    assert figures["recomputed_hops_per_affected_microbatch"] == 1.0
    assert figures["per_crash"][0]["recovery_extra_s"] == 0.5 and figures["per_crash"][0]["extra_s"] == 2.0


def test_a_redo_of_a_victims_work_is_its_crash_cost() -> None:
    """A ``contribution_redone`` event names the replicas whose work it redid (a list, no microbatch): the
    iteration it slowed counts for that crash."""
    dh = holder([1.0, 1.0, 1.0, 1.0, 3.0])
    redo = Recorded("r", [{"event": "recovery", "kind": "contribution_redone", "microbatch": None, "iteration": 4,
                           "replicas": ["v"], "microbatches": 2, "recomputed_hops": 2, "extra_s": 0.3}])
    figures = crash_figures([crash("v", 3)], dh, [dh, redo], 5)
    assert figures["per_crash"][0]["touched_iterations"] == [3, 4] and figures["per_crash"][0]["extra_s"] == 2.0
    assert figures["recomputed_hops"] == 0  # not a resend
    assert (figures["redone_steps"], figures["redone_microbatches"]) == (1, 2)


def test_a_failed_runs_trail_tells_each_nodes_steps_in_time_order() -> None:
    a = Recorded("r10", [{"event": "ready", "time": 1.0, "peer_id": "QmAAAA", "stage": 1, "from_iteration": 0},
                         {"event": "step", "time": 3.0, "stage": 1, "iteration": 0, "hash": "abcdef12", "count": 2,
                          "agreement": "fast", "members": ["QmAAAA", "QmBBBB"]}])
    b = Recorded("join0", [{"event": "resync", "time": 2.0, "stage": 1, "iteration": 0, "reason": "diverged"},
                           {"event": "iteration", "time": 2.5}])
    trail = step_trail([a, b])
    assert [line.split(" ", 2)[1:] for line in trail] == [
        ["r10", 'ready {"stage": 1, "from_iteration": 0, "peer": "AAAA"}'],
        ["join0", 'resync {"stage": 1, "iteration": 0, "reason": "diverged"}'],
        ["r10", 'step {"stage": 1, "iteration": 0, "count": 2, "agreement": "fast", "members": ["AAAA", "BBBB"], '
                '"hash": "abcdef"}']]
