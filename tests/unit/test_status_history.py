"""Events and series derived from successive status reads (``gwtf_cli.web.history``), injected times."""

from __future__ import annotations

import pytest

from gwtf_cli.web.history import GONE_KEEP_S, History
from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.status import SwarmSnapshot, summarize
from gwtfp2p.dht.records import NodeRecord, RouteSummary, run_id_of

pytestmark = pytest.mark.timeout(60)
SPEC = RunSpec(n_stages=2)
RUN = run_id_of(SPEC)
DH, R1, R1B, R2 = ("12D3KooW" + c * 10 for c in "defg")


def record(peer: str, stage: int, state: str = "online", iteration: int = 5, weight_hash: str = "",
           loss: float | None = None, **fields) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage, state=state,
                      iteration=iteration, weight_hash=weight_hash, loss=loss, **fields)


def read(*records: NodeRecord, spec: RunSpec = SPEC) -> dict:
    return summarize(SwarmSnapshot(run_id_of(spec), spec, {r.peer_id: r for r in records}))


def swarm(iteration: int = 5, **states: str) -> list[NodeRecord]:
    """dh → r1 (and r1b) → r2 → dh; ``states`` overrides a node's state, ``gone`` drops it."""
    nodes = [record(DH, 0, iteration=iteration, loss=3.0 - iteration / 100,
                    routing=(RouteSummary(next_peer=R1, sink=DH, units=2),)),
             record(R1, 1, iteration=iteration), record(R1B, 1, iteration=iteration),
             record(R2, 2, iteration=iteration)]
    names = {"dh": DH, "r1": R1, "r1b": R1B, "r2": R2}
    out = []
    for node in nodes:
        state = next((s for n, s in states.items() if names[n] == node.peer_id), "online")
        if state != "gone":
            out.append(node.model_copy(update={"state": state}))
    return out


def kinds(history: History) -> list[str]:
    return [e["kind"] for e in reversed(history.view()["events"])]  # oldest first


def test_a_crash_a_recovery_and_a_leave_are_told_apart():
    history = History()
    history.observe(read(*swarm()), 100.0)
    history.observe(read(*swarm(r1b="gone")), 104.0)  # r1b vanished without leaving: a crash
    crash = history.view()["events"][0]
    assert crash["kind"] == "crash" and crash["peer_id"] == R1B and crash["stage"] == 1
    assert [g["peer_id"] for g in history.view()["gone"]] == [R1B]
    history.observe(read(*swarm(r1b="gone", r2="leaving")), 106.0)
    history.observe(read(*swarm(r1b="gone", r2="gone")), 108.0)  # r2 said goodbye first: it left
    assert kinds(history) == ["run", "crash", "leaving", "left", "unserved"]
    assert [g["peer_id"] for g in history.view()["gone"]] == [R1B]  # one that left is no crash
    history.observe(read(*swarm(r1b="gone")), 110.0)  # r2 back: stage 2 served again
    assert kinds(history)[-2:] == ["join", "recovery"]


def test_a_newcomer_on_a_stage_that_lost_a_replica_is_a_recovery():
    history = History()
    history.observe(read(*swarm()), 0.0)
    history.observe(read(*swarm(r1b="gone")), 2.0)
    newcomer = record("12D3KooW" + "h" * 10, 1, state="joining")
    history.observe(read(*swarm(r1b="gone"), newcomer), 4.0)
    assert kinds(history) == ["run", "crash", "join", "recovery"]
    assert "after the crash of …" + R1B[-6:] in history.view()["events"][0]["text"]
    history.observe(read(*swarm(r1b="gone"), newcomer.model_copy(update={"state": "online"})), 6.0)
    assert kinds(history)[-1] == "online"


def test_crashed_nodes_are_forgotten_after_a_while_and_come_back_if_seen_again():
    history = History()
    history.observe(read(*swarm()), 0.0)
    history.observe(read(*swarm(r1b="gone")), 1.0)
    history.observe(read(*swarm(r1b="gone")), 1.0 + GONE_KEEP_S)
    assert history.view()["gone"] != []
    history.observe(read(*swarm(r1b="gone")), 2.0 + GONE_KEEP_S)
    assert history.view()["gone"] == []
    history.observe(read(*swarm()), 3.0)
    history.observe(read(*swarm(r1b="gone")), 4.0)
    history.observe(read(*swarm()), 5.0)  # its record is back (it was only slow to renew it)
    assert history.view()["gone"] == [] and kinds(history)[-1] == "join"


def test_the_series_has_one_point_per_iteration_and_a_new_run_starts_over():
    history = History()
    for t, iteration in enumerate([5, 5, 6, 8, 8]):
        history.observe(read(*swarm(iteration)), float(t))
    series = history.view()["series"]
    assert [p["iteration"] for p in series] == [5, 6, 8]
    assert series[1] == {"at_s": 2.0, "iteration": 6, "loss": pytest.approx(2.94), "tokens_per_s": 0.0}
    other = RunSpec(n_stages=2, seed=9)
    history.observe(read(*[r.model_copy(update={"run_id": run_id_of(other)}) for r in swarm(1)], spec=other), 9.0)
    assert [p["iteration"] for p in history.view()["series"]] == [1]
    assert kinds(history)[-1] == "run" and "a new run" in history.view()["events"][0]["text"]


def test_replicas_diverging_and_syncing_again_are_events_naming_the_replica():
    def stage1(second_hash: str) -> list[NodeRecord]:
        return [record(DH, 0), record(R1, 1, iteration=7, recent_hashes=((5, "aa"), (6, "bb"))),
                record(R1B, 1, iteration=7, recent_hashes=((5, "aa"), (6, second_hash))), record(R2, 2)]

    history = History()
    history.observe(read(*stage1("bb")), 0.0)
    history.observe(read(*stage1("cc")), 1.0)
    diverged = history.view()["events"][0]
    assert diverged["kind"] == "diverged" and diverged["stage"] == 1
    assert f"…{R1B[-6:]} diverged from …{R1[-6:]}" in diverged["text"] and "iteration 6" in diverged["text"]
    history.observe(read(*stage1("bb")), 2.0)
    assert kinds(history)[-1] == "in_sync"


def test_a_failed_read_keeps_the_last_data_and_says_why():
    history = History()
    history.observe(read(*swarm()), 0.0)
    before = history.view()
    history.fail("DHT get 'gwtf/current-run' did not finish within 10.0 s", 3.0)
    after = history.view()
    assert after["error"].startswith("DHT get") and after["error_at_s"] == 3.0
    assert after["version"] == before["version"] + 1 and after["read_at_s"] == 0.0 and after["reads"] == 1
    history.observe(read(*swarm()), 4.0)
    assert history.view()["error"] is None
