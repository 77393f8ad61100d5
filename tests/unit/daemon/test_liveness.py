"""The one failure detector (``Liveness``) with a fake pinger: verdicts, the retry after a dial error,
subscribers told once per death in order, revival by a newer heartbeat only, and adaptive ping deadlines."""

from __future__ import annotations

import asyncio

import pytest

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import DeadPeers, Liveness
from gwtfp2p.daemon.timeouts import Deadlines
from tests.unit.daemon.fakes import PA, PB, FakePinger, U

TIMINGS = Timings(unreachable_retry_delays_s=(0.0,), probe_floor_s=5.0)


def liveness(pinger: FakePinger, links: LinkTable | None = None) -> Liveness:
    return Liveness(U, pinger, links or LinkTable(1e9), Deadlines(TIMINGS), TIMINGS)


def test_a_dead_peer_stays_dead_until_a_newer_heartbeat() -> None:
    dead = DeadPeers()
    assert dead.seen(PA, 10.0)
    assert dead.declare(PA) and not dead.declare(PA) and dead.is_dead(PA)
    assert not dead.seen(PA, 10.0)  # its lingering record
    assert dead.is_dead(PA)
    assert dead.seen(PA, 12.0) and not dead.is_dead(PA)  # it heartbeats again: alive
    assert dead.declare(PB) and dead.is_dead(PB) and not dead.seen(PB, 0.0) and len(dead) == 1


def test_verdicts_and_subscribers_in_order_once_per_death() -> None:
    pinger = FakePinger(silent={PA})
    told: list[tuple[str, str]] = []
    detector = liveness(pinger)
    detector.subscribe(lambda peer: told.append(("first", peer)))
    detector.subscribe(lambda peer: told.append(("second", peer)))

    async def scenario() -> tuple[bool, bool, bool]:
        alive_b = await detector.alive(PB)
        alive_a = await detector.alive(PA)
        again = await detector.alive(PA)  # already dead: no ping, no second notice
        return alive_b, alive_a, again

    assert asyncio.run(scenario()) == (True, False, False)
    assert told == [("first", PA), ("second", PA)]
    assert [p for p, _ in pinger.pings] == [PB, PA, PA]  # a silent peer gets a second chance
    assert detector.is_dead(PA) and not detector.is_dead(PB)


def test_a_dial_error_is_tried_once_more_and_suspects_are_probed_in_the_background() -> None:
    pinger = FakePinger(unreachable={PA})
    detector = liveness(pinger)

    async def scenario() -> None:
        detector.suspect(PA)
        detector.suspect(PA)  # one probe at a time
        detector.suspect(U)  # never ourselves
        await detector.background.join()

    asyncio.run(scenario())
    assert [p for p, _ in pinger.pings] == [PA, PA] and detector.is_dead(PA)


def test_a_ping_measures_the_rtt_and_the_deadline_follows_it() -> None:
    links = LinkTable(1e9)
    pinger = FakePinger(rtt_s=1.5)
    detector = liveness(pinger, links)

    async def scenario() -> bool:
        first = await detector.ping(PA)
        await detector.ping(PA)
        return first

    assert asyncio.run(scenario())
    assert links.rtt(PA) == pytest.approx(1.5)
    (_, first_s), (_, second_s) = pinger.pings
    assert first_s == TIMINGS.probe_floor_s and second_s == pytest.approx(TIMINGS.timeout_factor * 1.5)
    assert not detector.is_dead(PA)


def test_a_newer_record_revives_a_peer_found_dead() -> None:
    detector = liveness(FakePinger(silent={PA}))
    assert detector.seen(PA, 5.0)
    asyncio.run(detector.alive(PA))
    assert not detector.seen(PA, 5.0) and detector.seen(PA, 6.0) and not detector.is_dead(PA)


def test_a_peer_that_stalls_one_deadline_or_answers_with_an_error_is_alive() -> None:
    pinger = FakePinger(silent_once={PA}, erroring={PB})
    detector = liveness(pinger)

    async def scenario() -> tuple[bool, bool]:
        return await detector.alive(PA), await detector.alive(PB)

    assert asyncio.run(scenario()) == (True, True)
    assert not detector.is_dead(PA) and not detector.is_dead(PB)


class Redialer:
    """Dials a peer at its record's addresses: ``reachable`` ones become pingable (their circuit opened)."""

    def __init__(self, pinger: FakePinger, reachable: set[str]) -> None:
        self.pinger, self.reachable = pinger, reachable
        self.calls: list[tuple[str, float]] = []

    async def redial(self, peer: str, *, timeout_s: float) -> bool:
        self.calls.append((peer, timeout_s))
        if peer in self.reachable:
            self.pinger.unreachable.discard(peer)
            return True
        return False


def test_a_peer_that_cannot_be_dialed_is_dialed_at_its_records_addresses_before_the_verdict() -> None:
    """The NAT test's flake: a replica sent to a relayed replica before p2pd knew its relay circuit, the dial
    and the ping 0.2 s later failed, and it was declared dead (the part split; its data holder excluded it)."""
    pinger = FakePinger(unreachable={PA, PB})
    redialer = Redialer(pinger, reachable={PA})
    detector = Liveness(U, pinger, LinkTable(1e9), Deadlines(TIMINGS), TIMINGS, redialer=redialer)

    async def scenario() -> tuple[bool, bool]:
        return await detector.alive(PA), await detector.alive(PB)

    assert asyncio.run(scenario()) == (True, False)  # PB: no route at its record's addresses either (it crashed)
    assert not detector.is_dead(PA) and detector.is_dead(PB)
    assert [p for p, _ in pinger.pings] == [PA, PA, PB, PB]
    assert [p for p, _ in redialer.calls] == [PA, PB]
    assert all(t == Deadlines(TIMINGS).ping_s(None) for _, t in redialer.calls)


def test_a_silent_peer_is_not_redialed() -> None:
    """Only a dial that failed at once is retried at the record's addresses; a timeout is the peer's silence."""
    pinger = FakePinger(silent={PA})
    redialer = Redialer(pinger, reachable={PA})
    detector = Liveness(U, pinger, LinkTable(1e9), Deadlines(TIMINGS), TIMINGS, redialer=redialer)
    assert not asyncio.run(detector.alive(PA)) and redialer.calls == []
