"""``RecordDialer``: a peer dialed at the addresses its DHT record publishes (fakes for the view and p2pd)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.swarm.redial import RecordDialer
from gwtfp2p.dht.records import NodeRecord, run_id_of
from gwtfp2p.transport import PeerUnreachable

pytestmark = pytest.mark.timeout(30)
HOME, GONE, NEW = ("12D3KooW" + c * 10 for c in "hgn")
RELAY = "12D3KooW" + "r" * 10
CIRCUIT = f"/ip4/10.77.0.10/tcp/4000/p2p/{RELAY}/p2p-circuit/p2p/{HOME}"


def record(peer: str, *maddrs: str) -> NodeRecord:
    return NodeRecord(run_id=run_id_of(RunSpec()), peer_id=peer, role="relay", stage=1, state="online", maddrs=maddrs)


class Connector:
    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.refuse, self.calls = refuse, []

    async def connect(self, peer: str, maddrs: Sequence[str], *, timeout_s: float) -> None:
        self.calls.append((peer, tuple(maddrs), timeout_s))
        if peer in self.refuse:
            raise PeerUnreachable(f"cannot connect to {peer}: all dials failed", peer)


def test_a_peer_is_dialed_at_its_record_an_expired_one_too_and_failures_are_answers() -> None:
    view = SimpleNamespace(records={HOME: record(HOME, CIRCUIT, "/ip4/192.168.101.2/tcp/4002")},
                           seen={GONE: record(GONE, "/ip4/10.77.0.13/tcp/4003"), NEW: record(NEW)})
    connector = Connector(refuse={GONE})
    dialer = RecordDialer(view, connector)  # type: ignore[arg-type]

    async def scenario() -> list[bool]:
        return [await dialer.redial(p, timeout_s=1.5) for p in (HOME, GONE, NEW, "12D3KooW" + "x" * 10)]

    assert asyncio.run(scenario()) == [True, False, False, False]
    assert connector.calls == [(HOME, (CIRCUIT, "/ip4/192.168.101.2/tcp/4002"), 1.5),
                               (GONE, ("/ip4/10.77.0.13/tcp/4003",), 1.5)]  # no addresses, no record: no dial
