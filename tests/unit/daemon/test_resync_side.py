"""Which side of a divergence keeps its state (``aggregation/resync.side``), and that every replica agrees."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.daemon.aggregation.resync import Replica, side


def r(name: str, iteration: int, **hashes: str) -> Replica:
    return Replica(name, iteration, {int(k[1:]): v for k, v in hashes.items()})


def test_replicas_with_equal_hashes_are_in_sync():
    assert side(r("a", 10, i8="x", i9="y"), [r("b", 12, i8="x", i9="y", i11="z")]) is None
    assert side(r("a", 10, i8="x"), [r("b", 30, i16="q")]) is None  # no shared iteration: nothing to compare


def test_the_side_that_kept_stepping_with_the_data_holders_wins():
    cut_off = r("a", 21, i19="x", i20="cut")
    stayed = r("b", 90, i19="x", i20="kept", i88="k")
    assert side(cut_off, [stayed]).keep is False
    assert side(cut_off, [stayed]).winners == ("b",)
    assert side(stayed, [cut_off]).keep is True
    assert side(stayed, [cut_off]).iteration == 20


def test_ahead_beats_more_replicas():
    two_stuck = [r("a", 21, i20="cut"), r("c", 21, i20="cut")]
    one_ahead = r("b", 40, i20="kept")
    verdict = side(two_stuck[0], [two_stuck[1], one_ahead])
    assert verdict.keep is False and verdict.winners == ("b",)


def test_equal_progress_the_larger_side_then_the_smallest_peer_id():
    assert side(r("a", 30, i20="x"), [r("b", 30, i20="y"), r("c", 30, i20="y")]).keep is False
    assert side(r("a", 30, i20="x"), [r("b", 30, i20="y")]).keep is True
    assert side(r("b", 30, i20="y"), [r("a", 30, i20="x")]).keep is False


def test_the_first_divergent_iteration_decides():
    verdict = side(r("a", 40, i8="p", i16="q", i24="r"), [r("b", 40, i8="p", i16="Q", i24="R")])
    assert verdict.iteration == 16


replica_sets = st.lists(
    st.tuples(st.integers(0, 60), st.dictionaries(st.sampled_from([8, 16, 24, 32]), st.sampled_from("xyz"),
                                                  max_size=4)),
    min_size=2, max_size=5)


@given(replica_sets)
def test_every_replica_reaches_the_same_verdict_and_exactly_one_side_keeps(spec):
    replicas = [Replica(f"p{i}", it, hashes) for i, (it, hashes) in enumerate(spec)]
    verdicts = {rep.peer_id: side(rep, [o for o in replicas if o is not rep]) for rep in replicas}
    involved = {p: v for p, v in verdicts.items() if v is not None}
    if not involved:
        return
    keepers = {p for p, v in involved.items() if v.keep}
    assert keepers, "somebody keeps its state"
    for peer, verdict in involved.items():
        if not verdict.keep:
            assert set(verdict.winners) & keepers, f"{peer} copies from a replica that keeps its state"
            assert peer not in verdict.winners
