"""A relayed node's p2pd that loses its bootstrap race is started again; any other failed start is not
(``swarm_dht.bootstrap_race``, ``SwarmDHT.create``; the DHT start itself is faked, nothing is launched)."""

from __future__ import annotations

import asyncio

import pytest

from gwtfp2p.dht import swarm_dht
from gwtfp2p.dht.errors import BootstrapError, DHTTimeout
from gwtfp2p.dht.p2pd_options import RelayOptions

pytestmark = pytest.mark.timeout(30)
PEER = "/ip4/10.77.0.10/tcp/4000/p2p/QmNWXa6LwczbfhLBKkhvyxkvHny9aHT9iaC6xEzcyPCeGe"
RACE = "Daemon failed to start: 2026/12/05 01:46:09 failed to connect to bootstrap peers"


def test_only_a_relayed_nodes_failed_bootstrap_is_the_race() -> None:
    assert swarm_dht.bootstrap_race("relayed", RACE)
    assert not swarm_dht.bootstrap_race("public", RACE)
    assert not swarm_dht.bootstrap_race("relayed", "Daemon failed to start: address already in use")


@pytest.mark.parametrize("mode, starts, error", [("relayed", swarm_dht.RELAYED_START_TRIES, DHTTimeout),
                                                  ("public", 1, BootstrapError)])
def test_a_lost_race_is_started_again_a_bounded_number_of_times(monkeypatch, mode, starts, error) -> None:
    calls: list[int] = []

    async def start(*_args, **_kwargs):
        calls.append(1)
        if len(calls) < swarm_dht.RELAYED_START_TRIES:
            raise RuntimeError(RACE)
        raise DHTTimeout("the DHT did not start within 5 s")  # the last try fails otherwise: not retried

    async def diagnose(peers):
        return [f"{p}: TCP connect works, but the libp2p handshake failed" for p in peers]

    monkeypatch.setattr(swarm_dht, "_start_dht", start)
    monkeypatch.setattr(swarm_dht, "diagnose_peers", diagnose)
    relay = RelayOptions(mode=mode, trusted_relays=(PEER,) if mode == "relayed" else ())
    with pytest.raises(error):
        asyncio.run(swarm_dht.SwarmDHT.create(initial_peers=[PEER], relay=relay, startup_timeout_s=5.0))
    assert len(calls) == starts
