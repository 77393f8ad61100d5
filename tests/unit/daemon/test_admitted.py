"""Permissioned runs: the creator publishes its admitted peers from a file; the other nodes follow the
creator's signed list (and nobody else's); an open run admits everyone. A fake DHT; no sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gwtfp2p.daemon.swarm.admitted import AdmittedPeers, read_peer_file
from tests.unit.daemon.fakes import PA, PB, pid

pytestmark = pytest.mark.timeout(30)
CREATOR, MALLORY, RUN = pid("Creatr"), pid("Mxry"), "0123456789abcdef"


class Store:
    """``SwarmDHT``'s admitted lists: by publisher."""

    def __init__(self) -> None:
        self.lists: dict[str, frozenset[str]] = {}
        self.publisher = CREATOR

    async def publish_admitted(self, run_id: str, peers: list[str], *, ttl_s: float) -> bool:
        self.lists[self.publisher] = frozenset(peers)
        return True

    async def read_admitted(self, run_id: str, creator: str) -> frozenset[str] | None:
        return self.lists.get(creator)


def test_an_open_run_admits_everyone() -> None:
    admitted = AdmittedPeers(PA, RUN)
    asyncio.run(admitted.update(Store()))
    assert not admitted.permissioned and admitted.allows(MALLORY)


def test_the_creators_list_decides(tmp_path: Path) -> None:
    peers = tmp_path / "admitted.txt"
    peers.write_text(f"{PA}\n# a comment\n\n{PB}  # the second relay\n")
    assert read_peer_file(str(peers)) == [PA, PB]
    store = Store()
    creator = AdmittedPeers(CREATOR, RUN, admit_path=str(peers))
    relay = AdmittedPeers(PA, RUN, creator=CREATOR)
    assert relay.allows(CREATOR) and not relay.allows(PB)  # nobody else before the list is read
    store.publisher = MALLORY
    asyncio.run(store.publish_admitted(RUN, [MALLORY], ttl_s=60))  # her own list does not count
    store.publisher = CREATOR
    asyncio.run(creator.update(store))
    asyncio.run(relay.update(store))
    assert relay.allows(PB) and not relay.allows(MALLORY) and creator.allows(PA)
    peers.write_text(f"{PA}\n")  # the creator takes PB off its list
    asyncio.run(creator.update(store))
    asyncio.run(relay.update(store))
    assert not relay.allows(PB) and relay.allows(PA)
