"""Replicas compared at equal iterations (``gwtf status``'s in_sync), and the records' hash window.

The case of issue 17: two replicas whose records show different hashes at iterations 713 and 731
were reported in sync. Now a replica is ``in_sync`` only once compared with another at an iteration
both report; a replica too far behind to compare is ``lagging``; a different hash at a common
iteration is ``diverged``, naming from which replica, at what iteration, and when they last agreed.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.status import SwarmSnapshot, hashes_of, stage_sync, summarize
from gwtfp2p.dht.records import (
    HASH_HISTORY_STEPS,
    MAX_RECENT_HASHES,
    MAX_RECORD_BYTES,
    RECENT_STEPS,
    NodeRecord,
    RecordError,
    encode_record,
    parse_node_record,
    pick_recent_hashes,
    run_id_of,
)

pytestmark = pytest.mark.timeout(120)
SPEC = RunSpec(n_stages=2)
RUN = run_id_of(SPEC)


def peer(i: int) -> str:
    return "12D3KooW" + "abcdefghijkmnopqrstuvwxyz"[i % 25] * 8 + str(1 + i // 25)


def chain(t: int, fork: int | None = None, tag: str = "") -> str:
    """The state hash after step ``t``; a replica that forked at ``fork`` has its own from there on."""
    mine = fork is not None and t >= fork
    return hashlib.sha256(f"{t}{':' + tag if mine else ''}".encode()).hexdigest()[:16]


def history(last: int, fork: int | None = None, tag: str = "") -> list[tuple[int, str]]:
    return [(t, chain(t, fork, tag)) for t in range(max(0, last - HASH_HISTORY_STEPS + 1), last + 1)]


def relay(i: int, last: int | None, fork: int | None = None, state: str = "online", stage: int = 1,
          **fields) -> NodeRecord:
    hashes = pick_recent_hashes(history(last, fork, str(i))) if last is not None else ()
    return NodeRecord(run_id=RUN, peer_id=peer(i), role="relay", stage=stage, state=state,
                      iteration=(last + 1) if last is not None else 0,
                      weight_hash=hashes[-1][1] if hashes else "", recent_hashes=hashes, **fields)


def old_style(i: int, iteration: int, weight_hash: str) -> NodeRecord:
    """A record of a daemon from before ``recent_hashes``: one hash, of the step before its iteration."""
    return NodeRecord(run_id=RUN, peer_id=peer(i), role="relay", stage=1, state="online", iteration=iteration,
                      weight_hash=weight_hash)


def statuses(records: list[NodeRecord]) -> dict[str, str]:
    return {p: v["status"] for p, v in stage_sync(records)["replicas"].items()}


# -- the case of issue 17 ------------------------------------------------------------------------

def test_different_hashes_at_713_and_731_are_not_shown_in_sync():
    records = [old_style(0, 713, "aaaa"), old_style(1, 731, "bbbb")]
    sync = stage_sync(records)
    assert sync["state"] != "in_sync"
    assert statuses(records) == {peer(0): "lagging", peer(1): "unverified"}
    assert sync["replicas"][peer(0)]["behind"] == 18


def test_replicas_18_steps_apart_share_an_iteration_in_their_windows_and_agree():
    records = [relay(0, 712), relay(1, 730)]
    sync = stage_sync(records)
    assert sync["state"] == "in_sync", sync
    assert sync["replicas"][peer(0)] == {"status": "in_sync", "iteration": 712, "behind": 18}


def test_a_replica_that_forked_is_named_with_the_iteration_and_the_last_agreement():
    records = [relay(0, 730), relay(1, 731), relay(2, 729, fork=726)]
    sync = stage_sync(records)
    assert statuses(records) == {peer(0): "in_sync", peer(1): "in_sync", peer(2): "diverged"}
    v = sync["replicas"][peer(2)]
    # every window holds the last 12 steps: the fork itself (726) is compared, the step before it agreed
    assert v["iteration_diverged"] == 726 and v["last_agreed"] == 725
    assert set(v["diverged_from"]) == {peer(0), peer(1)}
    assert v["hash"] == chain(726, 726, "2") and v["diverged_from"][peer(0)] == chain(726)
    assert sync["state"] == "diverged"


def test_two_replicas_that_disagree_are_both_marked():
    records = [relay(0, 100), relay(1, 100, fork=99)]
    assert statuses(records) == {peer(0): "diverged", peer(1): "diverged"}


def test_a_replica_that_resynced_after_diverging_is_in_sync():
    fresh = relay(1, 100)
    forked_then_resynced = dict(fresh.recent_hashes) | {96: "dead"}  # differs at 96, agrees from 97 on
    record = fresh.model_copy(update={"recent_hashes": tuple(sorted(forked_then_resynced.items()))})
    assert statuses([relay(0, 100), record]) == {peer(0): "in_sync", peer(1): "in_sync"}


def test_leaving_and_hashless_replicas_are_not_compared():
    records = [relay(0, 50), relay(1, 50, fork=10, state="leaving"), relay(2, None, state="joining")]
    assert statuses(records) == {peer(0): "in_sync", peer(1): "leaving", peer(2): "no_hash"}
    assert stage_sync(records)["state"] == "in_sync"


def test_old_records_compare_their_one_hash_at_the_step_before_their_iteration():
    assert hashes_of(old_style(0, 10, "abcd")) == {9: "abcd"}
    assert hashes_of(old_style(0, 0, "")) == {}
    assert statuses([old_style(0, 10, "abcd"), old_style(1, 10, "abcd")]) == {peer(0): "in_sync", peer(1): "in_sync"}
    assert statuses([old_style(0, 10, "abcd"), old_style(1, 10, "ef01")]) == {peer(0): "diverged",
                                                                              peer(1): "diverged"}


@settings(max_examples=200, deadline=None)
@given(lasts=st.lists(st.integers(0, 24), min_size=2, max_size=6), base=st.integers(0, 5000),
       fork=st.none() | st.integers(-30, 0), victim=st.integers(0, 5))
def test_replicas_in_lock_step_agree_and_a_minority_fork_is_found(lasts, base, fork, victim):
    """Records up to 24 steps apart always share an iteration; a fork in one of ≥ 3 replicas, within its
    window, marks exactly that replica diverged at the fork or later, agreeing before."""
    lasts = [base + d for d in lasts]
    victim %= len(lasts)
    fork_at = None if fork is None else lasts[victim] + fork
    records = [relay(i, last, fork_at if i == victim else None) for i, last in enumerate(lasts)]
    sync = stage_sync(records)
    found = {p for p, v in sync["replicas"].items() if v["status"] == "diverged"}
    if fork_at is None:
        assert found == set() and sync["state"] == "in_sync", sync
        return
    if len(records) >= 3 and fork_at <= min(lasts) - 24:  # every other window holds an iteration after the fork
        assert found == {peer(victim)}, sync
    if peer(victim) in found:
        v = sync["replicas"][peer(victim)]
        assert v["iteration_diverged"] >= fork_at
        assert v["last_agreed"] is None or v["last_agreed"] < fork_at
    assert all(v["status"] in ("in_sync", "diverged") for v in sync["replicas"].values())


# -- the record field and its window -------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(a=st.integers(0, 10**6), gap=st.integers(0, 24))
def test_windows_of_records_up_to_24_steps_apart_overlap(a, gap):
    behind = dict(pick_recent_hashes(history(a)))
    ahead = dict(pick_recent_hashes(history(a + gap)))
    assert behind.keys() & ahead.keys()
    assert len(ahead) <= MAX_RECENT_HASHES and sorted(ahead) == list(ahead)
    assert set(range(max(0, a + gap - RECENT_STEPS + 1), a + gap + 1)) <= set(ahead)


def test_the_window_of_a_short_history_is_all_of_it():
    assert pick_recent_hashes([(0, "aa"), (1, "bb")]) == ((0, "aa"), (1, "bb"))
    assert pick_recent_hashes([(0, "aa"), (1, "")]) == ((0, "aa"),)  # no hash, no entry
    assert pick_recent_hashes([]) == ()


def test_records_without_recent_hashes_still_parse():
    data = json.loads(encode_record(relay(0, None)))
    del data["recent_hashes"]
    assert parse_node_record(json.dumps(data).encode()).recent_hashes == ()


@pytest.mark.parametrize("bad", [
    [[1, "aa"]] * 2,  # not strictly increasing
    [[2, "aa"], [1, "bb"]],
    [[i, "aa"] for i in range(MAX_RECENT_HASHES + 1)],  # too many
    [[1, "XYZ"]],  # not hex
    [[1, ""]],
    [[-1, "aa"]],
    [[1, "a" * 65]],
    [["1", "aa"]],
    [[1, "aa", 3]],
])
def test_bad_recent_hashes_are_rejected(bad):
    data = json.loads(encode_record(relay(0, None)))
    data["recent_hashes"] = bad
    with pytest.raises(RecordError):
        parse_node_record(json.dumps(data).encode())


def test_a_full_window_of_the_longest_hashes_round_trips():
    # (the worst case of every field together is test_dht_records' size-cap test)
    record = relay(0, 2**53 - 1).model_copy(
        update={"recent_hashes": tuple((2**53 - MAX_RECENT_HASHES + i, "f" * 16) for i in range(MAX_RECENT_HASHES))})
    raw = encode_record(record)
    assert parse_node_record(raw) == record and len(raw) < MAX_RECORD_BYTES


# -- in the summary ------------------------------------------------------------------------------

def test_summary_says_who_diverged_from_whom():
    holder = NodeRecord(run_id=RUN, peer_id=peer(40), role="data", stage=0, state="online", iteration=61)
    records = [holder, relay(0, 60), relay(1, 60), relay(2, 60, fork=58), relay(3, 60, stage=2)]
    summary = summarize(SwarmSnapshot(RUN, SPEC, {r.peer_id: r for r in records}))
    assert summary["replicas_in_sync"] is False
    stage1 = summary["stages"][1]
    assert stage1["in_sync"] is False and stage1["sync"]["state"] == "diverged"
    assert summary["stages"][2]["in_sync"] is True
    [line] = summary["sync_problems"]
    assert line.startswith(f"stage 1: replica …{peer(2)[-6:]} diverged from …{peer(0)[-6:]}, …{peer(1)[-6:]}")
    assert "at iteration 58 (still agreed at iteration 57)" in line
    nodes = {n["peer_id"]: n for n in summary["nodes"]}
    assert nodes[peer(2)]["sync"] == "diverged" and nodes[peer(0)]["sync"] == "in_sync"
    assert nodes[peer(0)]["hash_iteration"] == 60 and len(nodes[peer(0)]["recent_hashes"]) == MAX_RECENT_HASHES
