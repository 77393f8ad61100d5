"""The view remembers every record it read (``SwarmView.seen``), and the peer book reads that memory:
a replica whose record was seen once, then expired or was dropped as dead before anything asked the
book about it, still counts as a member of its part, so the contribution it signed and a survivor
forwards (the agreement pulls a crashed member's contribution) is not refused."""

from __future__ import annotations

import asyncio

from gwtfp2p.daemon.swarm.peers import PeerBook
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.dht import NodeRecord
from tests.unit.daemon.fakes import PA, PB, pid

RUN = "c6ef4b574eecf45a"
ME = pid("Me")


class DHT:
    peer_id = ME

    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}

    async def read_nodes(self, run_id: str) -> dict[str, NodeRecord]:
        return dict(self.nodes)


def relay(peer: str, stage: int) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role="relay", stage=stage, state="online")


def test_a_record_seen_once_still_proves_its_part_after_it_expired_unasked() -> None:
    dht = DHT()
    view = SwarmView(dht, RUN, heartbeat_s=1.0)
    book = PeerBook(ME, None, lambda: view.seen, signing=False)
    dht.nodes = {PA: relay(PA, 2), PB: relay(PB, 2)}
    asyncio.run(view.refresh())
    view.forget(PA)  # declared dead by the failure detector
    del dht.nodes[PA]  # ... and its record expired
    asyncio.run(view.refresh())
    assert PA not in view.records and view.online(2) == [PB]
    assert book.serves(PA, 2) and not book.serves(PA, 1)  # asked only now
    assert not book.serves(pid("Never"), 2)


def test_the_latest_record_read_is_the_one_remembered() -> None:
    dht = DHT()
    view = SwarmView(dht, RUN, heartbeat_s=1.0)
    dht.nodes = {PA: relay(PA, 1)}
    asyncio.run(view.refresh())
    dht.nodes = {PA: relay(PA, 2).model_copy(update={"updated_at": 5.0})}
    asyncio.run(view.refresh())
    dht.nodes = {}
    asyncio.run(view.refresh())
    assert view.records == {} and view.seen[PA].stage == 2
