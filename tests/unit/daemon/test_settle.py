"""The settle policy of an aggregation round (pure, times passed in): unannounced peers hold a round
only for a while, probes start late and are rate-limited, one probe per peer at a time."""

from __future__ import annotations

from gwtfp2p.daemon.aggregation.settle import SettlePolicy
from gwtfp2p.daemon.config import Timings
from tests.unit.daemon.fakes import DA, PA, PB

TIMINGS = Timings(unannounced_s=10.0, probe_after_s=0.5, probe_every_s=1.0)


def test_unannounced_peers_hold_the_round_until_ignored() -> None:
    policy = SettlePolicy(TIMINGS)
    waiting = policy.unannounced([PA, PB, DA], members={PA}, dead={DA})
    assert waiting == [PB]
    assert policy.holding(waiting, waited_s=9.0) == [PB]
    assert policy.holding(waiting, waited_s=10.5) == [] and policy.ignored == {PB}
    assert policy.unannounced([PA, PB], members={PA}, dead=set()) == []  # ignored for good


def test_probes_start_late_one_at_a_time_and_at_most_every_period() -> None:
    policy = SettlePolicy(TIMINGS)
    assert policy.to_probe([PA, PB], waited_s=0.2, now_s=100.0) == []
    assert policy.to_probe([PA, PB, PA], waited_s=0.6, now_s=100.0) == [PA, PB]
    assert policy.probe_started(PA, 100.0) and not policy.probe_started(PA, 100.1)
    assert policy.to_probe([PA, PB], waited_s=0.7, now_s=100.2) == [PB]  # PA's probe is under way
    policy.probe_done(PA)
    assert policy.to_probe([PA], waited_s=0.8, now_s=100.5) == []  # probed 0.5 s ago
    assert policy.to_probe([PA], waited_s=1.6, now_s=101.0) == [PA]
