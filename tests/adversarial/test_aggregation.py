"""Attacks on a part's aggregation: a member that answers the honest sum with −1000 x it, a loss sum of
1e300 sent to the data holders, and a forged agreement query that claims an honest replica died."""

from __future__ import annotations

import pytest

from tests.adversarial.support import Honest, Mallory, logged

pytestmark = pytest.mark.timeout(300)


def test_a_member_poisoning_the_sum_is_screened_out(honest: Honest, mallory: Mallory) -> None:
    since = honest.iteration()
    replicas = honest.stages[1]
    mallory.do("become", role="relay", stage=1)
    start = max(r.of("step")[-1]["iteration"] for r in replicas) + 2
    answers = mallory.do("member", stage=1, peers=[r.peer_id for r in replicas], from_iteration=start)
    assert answers and all(a["accepted"] for a in answers), answers  # she is a member by the rules ...
    assert mallory.do("poison", stage=1, factor=1000) == "poisoning"
    for replica in replicas:  # ... whose contribution every honest replica screens out
        excluded = replica.wait_event("excluded_contribution", 120, peer=mallory.peer_id)
        assert "median" in excluded["reason"]
    honest.train(5)
    steps = [r.wait_event("step", 60, iteration=excluded["iteration"]) for r in replicas]
    assert steps[0]["hash"] == steps[1]["hash"] and mallory.peer_id in steps[0]["dropped"]
    mallory.kill()
    honest.assert_healthy(since, more=3)
    assert all(logged(r, f"contribution of {mallory.peer_id} excluded") for r in replicas)


def test_an_overflowing_loss_does_not_end_the_data_holders_loop(honest: Honest, mallory: Mallory) -> None:
    since = honest.iteration()
    mallory.do("become", role="data", stage=0)
    result = mallory.do("loss_bomb", holder=honest.dh.peer_id, iteration=honest.iteration() + 1)
    assert result.startswith("refused") and "loss_sum" in result, result
    assert logged(honest.dh, f"peer {mallory.peer_id} excluded")
    honest.assert_healthy(since)


def test_a_forged_query_does_not_split_the_replicas(honest: Honest, outsider: Mallory) -> None:
    since = honest.iteration()
    target, victim = honest.stages[1]
    iteration = target.of("step")[-1]["iteration"] + 1
    for t in (iteration, iteration + 1):
        outsider.do("query", target=target.peer_id, victim=victim.peer_id, stage=1, iteration=t)
    honest.assert_healthy(since)
    later = [e for e in target.of("step") if e["iteration"] >= iteration]
    assert later and all(victim.peer_id in e["members"] for e in later), later
    assert logged(target, f"it claims {victim.peer_id} is dead, but {victim.peer_id} answers our probe")
