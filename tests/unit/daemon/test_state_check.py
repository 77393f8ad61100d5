"""The joiner's state check: which hash a majority of a stage's records vouch for (``state_check``)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.aggregation.state_check import agreed_hash, anchor_after, majority_hash, plausible_ceiling
from gwtfp2p.dht.records import HASH_HISTORY_STEPS, NodeRecord, pick_recent_hashes, run_id_of

pytestmark = pytest.mark.timeout(60)
RUN = run_id_of(RunSpec(n_stages=2))


def peer(i: int) -> str:
    return "12D3KooW" + "abcdefgh"[i] * 8


def chain(t: int, tag: str = "") -> str:
    return hashlib.sha256(f"{t}{tag}".encode()).hexdigest()[:16]


def replica(i: int, last: int, tag: str = "") -> NodeRecord:
    """Replica ``i``'s record after step ``last`` (its state hashes ``chain``, forked with ``tag``)."""
    hashes = pick_recent_hashes([(t, chain(t, tag)) for t in range(max(0, last - HASH_HISTORY_STEPS + 1), last + 1)])
    return NodeRecord(run_id=RUN, peer_id=peer(i), role="relay", stage=1, state="online", iteration=last + 1,
                      weight_hash=hashes[-1][1], recent_hashes=hashes)


def test_a_hash_needs_more_than_half_of_the_online_replicas() -> None:
    digest, _, _ = majority_hash([replica(0, 434), replica(1, 434), replica(2, 434, "noised")], 435)
    assert digest == chain(434)
    digest, possible, why = majority_hash([replica(0, 434), replica(2, 434, "noised")], 435)
    assert digest is None and not possible and "2 must agree" in why


def test_a_replica_silent_on_the_step_may_still_vouch() -> None:
    digest, possible, _ = majority_hash([replica(0, 434), replica(1, 431), replica(2, 434, "noised")], 435)
    assert digest is None and possible


def test_an_announcement_seen_once_counts_after_the_replica_moved_past_it() -> None:
    """A stage stepping faster than records are published: replica 1's record announced step 434 once;
    its next one holds only its last steps (and multiples of 8), 434 no longer among them."""
    seen: dict[str, str] = {}
    first = [replica(0, 434), replica(1, 435), replica(2, 440, "noised")]
    assert majority_hash(first, 435, seen)[0] == chain(434)
    later = [replica(0, 450), replica(1, 450), replica(2, 450, "noised")]
    assert 434 not in dict(later[1].recent_hashes)
    assert majority_hash(later, 435)[0] is None
    assert majority_hash(later, 435, seen)[0] == chain(434)


class View:
    """A DHT view whose records move on at every refresh: replica 1 publishes 434's hash for one read only."""

    def __init__(self, reads: list[list[NodeRecord]]) -> None:
        self.reads = reads
        self.now = 0

    async def refresh(self) -> None:
        self.now = min(self.now + 1, len(self.reads) - 1)

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return self.reads[self.now]


def test_agreed_hash_remembers_what_each_replica_announced_across_reads() -> None:
    reads = [[replica(0, 434), replica(1, 430), replica(2, 440, "x")],
             [replica(0, 436), replica(1, 435), replica(2, 441, "x")],
             [replica(0, 450), replica(1, 450), replica(2, 450, "x")]]
    digest = asyncio.run(agreed_hash(View(reads), 1, 435, wait_s=5.0, poll_s=0.0))
    assert digest == chain(434)


def test_agreed_hash_gives_up_when_no_majority_can_emerge() -> None:
    reads = [[replica(0, 434, "a"), replica(1, 434, "b"), replica(2, 434, "c")]]
    assert asyncio.run(agreed_hash(View(reads), 1, 435, wait_s=5.0, poll_s=0.0)) is None


@pytest.mark.parametrize(("iteration", "anchor"), [(1, 1), (2, 9), (9, 9), (10, 17), (435, 441), (441, 441)])
def test_the_anchor_is_the_first_iteration_after_a_step_records_keep_longest(iteration: int, anchor: int) -> None:
    assert anchor_after(iteration) == anchor and (anchor - 1) % 8 == 0


def test_an_anchor_step_stays_announced_while_a_stage_outruns_its_records() -> None:
    """What a joiner whose download no majority vouches for relies on: it replays to ``anchor_after``."""
    target = anchor_after(435)
    for last in range(target, target + 24):
        assert dict(replica(0, last).recent_hashes).get(target - 1) == chain(target - 1)


def holder(iteration: int, i: int = 7) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer(i), role="data", stage=0, state="online", iteration=iteration)


def test_a_claim_past_the_data_holders_iteration_does_not_vote() -> None:
    """One honest replica left online (the other re-syncing) and a record claiming a million iterations
    more: without the ceiling the claim vetoes every join; with it, the honest record alone decides."""
    far = replica(2, 10**6, "noised")
    assert majority_hash([replica(0, 434), far], 435)[0] is None
    ceiling = plausible_ceiling([holder(436), holder(10**9, 6), holder(430, 5)])
    assert ceiling == 436 + HASH_HISTORY_STEPS  # the lower median: one lying holder cannot raise it
    digest, _, _ = majority_hash([replica(0, 434), far], 435, ceiling=ceiling)
    assert digest == chain(434)


def test_a_state_past_the_data_holders_iteration_is_refused_at_once() -> None:
    far = replica(2, 10**6, "noised")
    digest, possible, why = majority_hash([replica(0, 434), replica(1, 434), far], 10**6 + 1,
                                          ceiling=plausible_ceiling([holder(436)]))
    assert digest is None and not possible and "past the data holders' iteration" in why


def test_a_claim_within_the_slack_still_votes() -> None:
    """Records are published at different moments: a replica ahead of a stale data holder record counts."""
    records = [replica(0, 434), replica(1, 434, "noised"), replica(2, 470)]  # 2 still announces anchor 432
    assert majority_hash(records, 433, ceiling=plausible_ceiling([holder(430)]))[0] == chain(432)
    assert majority_hash(records, 433, ceiling=plausible_ceiling([holder(300)]))[0] is None
    assert plausible_ceiling([]) is None


def test_a_replica_past_a_step_it_no_longer_announces_cannot_make_a_majority_possible() -> None:
    """Replica 1 moved past step 434 (not an anchor) by more than its last steps: waiting for it is futile."""
    digest, possible, _ = majority_hash([replica(0, 434), replica(1, 450), replica(2, 434, "noised")], 435)
    assert digest is None and not possible
    digest, possible, _ = majority_hash([replica(0, 432), replica(1, 450), replica(2, 432, "noised")], 433)
    assert digest == chain(432)  # an anchor step stays announced longer


def test_a_replica_that_joined_by_download_vouches_for_the_state_it_loaded() -> None:
    """A stage of two replicas, one of them joined by downloading the other's state of iteration 28 and not
    stepped since (a churn demo in CI): a third joiner needs both to vouch for step 27. The joined replica's
    record announces its loaded state's hash (``Joiner.loaded_hash``); without it (``weight_hash`` empty until
    its first step), no majority could show until the stage stepped 28, and the third joiner gave up."""
    veteran = replica(0, 27)
    joined = NodeRecord(run_id=RUN, peer_id=peer(1), role="relay", stage=1, state="online", iteration=28,
                        weight_hash=chain(27))
    assert majority_hash([veteran, joined], 28)[0] == chain(27)
    silent = joined.model_copy(update={"weight_hash": ""})
    digest, possible, why = majority_hash([veteran, silent], 28)
    assert digest is None and possible and "1 of 2 replicas; 2 must agree" in why
