"""The pure half of recovery: the kept-output table, the resend planner's tags, distances and claims,
the reaction to a ``Lost`` report, and the chain of upstream hops to tell (properties with hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.daemon.datapath import resend
from gwtfp2p.daemon.datapath.kept import KeptTable
from gwtfp2p.daemon.datapath.resend import Claims, LostAction
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.transport import TransferMeta
from tests.unit.daemon.fakes import DA, DH, PA, PB, U, mb, pid


def test_kept_table_deadlines_resends_and_completions() -> None:
    table = KeptTable()
    meta = TransferMeta(microbatch=mb(0), stage=2)
    table.add("a", meta, "out-a", Hop(PA, "u1"), now=0.0, wait_s=2.0, expected_s=0.5)
    table.add("b", meta, "out-b", Hop(PB, "u2"), now=0.0, wait_s=5.0, expected_s=0.5)
    assert [k for k, _ in table.due(1.0)] == [] and [k for k, _ in table.due(2.0)] == ["a"]
    table.extend("a", now=2.0, longer=lambda wait: 2 * wait)  # it answered a probe: 4 s more
    assert [k for k, _ in table.due(5.5)] == ["b"] and [k for k, _ in table.due(6.0)] == ["a", "b"]
    assert table.via(PA) == ["a"]
    table.failed("a", 6.0)
    table.resent("a", meta, Hop(PB, ""), PA, "forward_resend", now=6.1, wait_s=2.0)
    assert table.via(PB) == ["a", "b"] and table.get("a").resends == 1
    done = table.complete("a", now=7.0)
    assert done is not None and done.resent and done.kind == "forward_resend" and done.lost == PA
    assert done.round_trip_s == 7.0 and done.extra_s == pytest.approx(6.5) and done.detect_s == 6.0
    plain = table.complete("b", now=1.0)
    assert plain is not None and not plain.resent and plain.extra_s == 0.0
    assert table.complete("b", now=1.0) is None and len(table) == 0


def test_distances_order_holders_down_to_the_tail() -> None:
    assert resend.distance(3, 2, 3) == 1 and resend.distance(0, 2, 3) == 2  # stage 3, then the tail
    assert resend.distance(2, 1, 2) == 1 and resend.distance(0, 1, 2) == 2


def test_a_resend_carries_the_recovery_tags_and_drops_stale_ones() -> None:
    kept = TransferMeta(microbatch=mb(0), stage=2, tags={"lost": pid("Old"), "then.3": pid("Old"), "x": 1},
                        attempt=2)
    plain = resend.resend_meta(kept, PA, U, None, 2, 3)
    assert plain.kind == "forward_resend" and plain.holder == ""
    assert plain.meta.tags == {"x": 1, "lost": PA, "from": U} and plain.meta.attempt == 3
    rejoin = resend.resend_meta(kept, PA, U, (1, DA), 2, 3)
    assert rejoin.kind == "backward_resend" and rejoin.holder == DA
    assert rejoin.meta.tags == {"x": 1, "lost": PA, "from": U, "rejoin": True, "then.3": DA}
    tail = resend.resend_meta(kept, PA, U, (2, DH), 2, 3)  # the tail is the holder: no then.<stage> hint
    assert tail.meta.tags == {"x": 1, "lost": PA, "from": U, "rejoin": True}
    redirected = resend.redirect_meta(TransferMeta(microbatch=mb(0), stage=3, tags={"y": 2}), rejoin.meta.tags)
    assert redirected.tags == {"y": 2, "lost": PA, "from": U, "rejoin": True, "then.3": DA}


def test_claims_keep_the_nearest_holder_and_know_when_all_answered() -> None:
    claims = Claims(waiting={DA, DH})
    claims.claim("k", 2, DH)
    claims.claim("k", 1, DA)
    claims.claim("k", 3, PB)
    assert claims.claims == {"k": (1, DA)}
    assert not claims.answered(DA) and claims.answered(DH)


def test_the_reaction_to_a_lost_report() -> None:
    table = KeptTable()
    meta = TransferMeta(microbatch=mb(0), stage=2)
    kept = table.add("k", meta, None, Hop(PA, ""), 0.0, 1.0, 1.0)
    assert resend.on_lost(None, PA, DA, False) is LostAction.IGNORE
    assert resend.on_lost(kept, PA, DA, True) is LostAction.CLAIM
    assert resend.on_lost(kept, PA, DA, False) is LostAction.RECOVER
    kept.busy = True
    assert resend.on_lost(kept, PA, DA, False) is LostAction.IGNORE
    kept.busy, kept.hop, kept.lost, kept.hint = False, Hop(PB, ""), PA, ""
    assert resend.on_lost(kept, PA, DA, False) is LostAction.RESEND_AGAIN  # resent before the holder was known
    kept.hint = DA
    assert resend.on_lost(kept, PA, DA, False) is LostAction.IGNORE  # already rejoining that holder


@given(st.lists(st.sampled_from([pid(f"N{i}") for i in range(8)]), min_size=1, max_size=8, unique=True),
       st.data())
def test_the_report_chain_walks_up_from_the_lost_hop(path: list[str], data: st.DataObject) -> None:
    lost = data.draw(st.sampled_from(path))
    chain = resend.report_chain(tuple(path), lost)
    index = path.index(lost)
    assert [up for up, _ in chain] == path[:index][::-1]  # nearest first, up to the source
    assert all(path.index(after) == path.index(up) + 1 for up, after in chain)  # each names its next hop
    assert resend.report_chain(tuple(path), pid("Nobody")) == []
