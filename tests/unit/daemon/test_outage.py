"""Outages (``swarm/outage.py``): when a node is cut off, when it is back, and whom it dials meanwhile."""

from __future__ import annotations

import asyncio

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.outage import OutageClock, OutageWatch, redial_targets
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import PeerUnreachable
from tests.unit.daemon.fakes import FakeClock, pid

RUN = "0123456789abcdef"


def record(name: str, *maddrs: str) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=pid(name), role="relay", stage=1, state="online", maddrs=maddrs)


def test_news_within_the_window_is_no_outage_and_silence_past_it_is():
    clock = OutageClock(10.0, started_at=0.0)
    assert clock.update(last_news=0.0, now=9.0) is None
    assert clock.update(last_news=5.0, now=14.0) is None
    assert clock.update(last_news=5.0, now=15.5) == "outage"
    assert clock.update(last_news=5.0, now=40.0) is None  # still out: reported once
    assert clock.update(last_news=41.0, now=41.5) == "back"
    assert clock.since is None


def test_news_older_than_the_outage_does_not_end_it():
    clock = OutageClock(10.0, started_at=0.0)
    assert clock.update(last_news=1.0, now=12.0) == "outage"
    assert clock.update(last_news=11.0, now=20.0) is None  # an answer from before the outage was declared
    assert clock.update(last_news=21.0, now=22.0) == "back"


def test_a_node_alone_from_the_start_has_no_outage():
    clock = OutageClock(10.0, started_at=0.0)
    assert clock.update(last_news=0.0, now=100.0, peers_known=0) is None
    assert clock.update(last_news=0.0, now=101.0, peers_known=1) == "outage"


def test_redial_targets_initial_peers_first_then_every_known_address_with_its_id():
    initial = ("/ip4/1.2.3.4/tcp/1/p2p/" + pid("Boot"),)
    a = record("A", "/ip4/5.6.7.8/tcp/2")
    b = record("B", f"/ip4/9.9.9.9/tcp/3/p2p/{pid('R')}/p2p-circuit/p2p/{pid('B')}")
    targets = redial_targets(initial, [a, b, a])
    assert targets[0] == initial[0]
    assert f"/ip4/5.6.7.8/tcp/2/p2p/{pid('A')}" in targets
    assert targets[2].endswith(f"/p2p-circuit/p2p/{pid('B')}")
    assert len(targets) == 3


class FakeDHT:
    def __init__(self) -> None:
        self.rejoined: list[list[str]] = []

    async def rejoin(self, maddrs, timeout_s=5.0) -> int:
        self.rejoined.append(list(maddrs))
        return 0


class FakeDialer:
    def __init__(self) -> None:
        self.dialled: list[str] = []

    async def connect(self, peer_id, maddrs, *, timeout_s) -> None:
        self.dialled.append(peer_id)
        raise PeerUnreachable("network is down", peer_id)


def test_the_watch_declares_the_outage_redials_with_backoff_and_reports_the_return():
    clock, news, events = FakeClock(0.0), [0.0], []
    dht, dialer, progress = FakeDHT(), FakeDialer(), NodeProgress(state="online")
    known = [record("A", "/ip4/5.6.7.8/tcp/2")]
    watch = OutageWatch(dht=dht, dialer=dialer, initial_peers=("/ip4/1.2.3.4/tcp/1/p2p/" + pid("Boot"),),
                        records=lambda: known, last_news=lambda: news[0], poke=lambda: None,
                        progress=progress, events=Events(events.append),
                        timings=Timings(outage_after_s=10.0, reconnect_every_s=2.0, reconnect_max_s=5.0), clock=clock)

    async def scenario() -> None:
        for second in range(1, 41):
            clock.now = float(second)
            if second == 30:
                news[0] = clock.now  # the network is back
            await watch.check()

    asyncio.run(scenario())
    assert [e["event"] for e in events] == ["outage", "reconnected"]
    assert events[1]["outage_s"] == 19.0  # declared at 11 s, back at 30 s
    # redialled at 11, 13, 16, 20.5 -> 21, 26 (pauses 2, 3, 4.5, then the 5 s cap) until the return at 30
    assert len(dht.rejoined) == 5
    assert dht.rejoined[0][0].endswith(pid("Boot")) and pid("A") in dialer.dialled
    assert watch.was_cut_off and progress.state == "joining"  # the part still has to re-sync, unrouted
    watch.resynced()
    assert not watch.was_cut_off
