"""Forged and garbage DHT records: another node's record overwritten (shown leaving), fake relays, the
run replaced (with garbage and with another spec), the node list replaced by a plain value, a data
holder's record with a huge iteration. Every store is refused by the honest nodes' validator; the
swarm, as ``gwtf status`` shows it, is unchanged and keeps training."""

from __future__ import annotations

import pytest

from tests.adversarial.support import Honest, Mallory, logged

pytestmark = pytest.mark.timeout(300)


def test_forged_and_garbage_records_are_refused(honest: Honest, outsider: Mallory) -> None:
    since = honest.iteration()
    victim = honest.stages[1][0]
    stored = outsider.do("forge_records", victim=victim.peer_id, holder=honest.dh.peer_id)
    assert isinstance(stored, dict), stored
    assert stored.pop("run_own_sealed") is True  # her own run is hers to publish ...
    assert not any(stored.values()), stored  # ... nothing else is stored anywhere
    status = honest.status()
    assert status["run_id"] == honest.dh.ready["run_id"]  # ... and the swarm's run is still the one shown
    nodes = {n["peer_id"]: n for n in status["nodes"]}
    assert {d.peer_id for d in (honest.dh, *honest.relays)} <= set(nodes)
    assert not any(n["capacity"] >= 10**6 for n in nodes.values()), nodes  # no fake relay
    assert nodes[victim.peer_id]["state"] == "online"
    assert nodes[honest.dh.peer_id]["iteration"] < 10**6
    assert status["replicas_in_sync"], status["sync_problems"]
    honest.assert_healthy(since)
    assert any(logged(d, "refusing a DHT record") for d in (honest.dh, *honest.relays))
    forwards = [e.get("forwards", 0) for e in victim.of("progress")]
    assert forwards and forwards[-1] > 0  # the victim is still routed
