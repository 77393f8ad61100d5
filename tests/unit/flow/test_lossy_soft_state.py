"""Working units survive lost messages (issue 15, "durable under loss"): a unit whose refreshes stop coming is
asked for once and dropped only after a second TTL with none (``SoftState._expire``), and a growth request left
unanswered is sent once more before its units are cancelled (``Growth._ask_again``). Driven by the in-memory bus
with chosen messages dropped."""

from __future__ import annotations

from collections.abc import Callable

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.messages import Cancel, Envelope, Refresh, Request
from tests.unit.flow.test_node import two_stage_line

Drop = Callable[[str, Envelope, int], bool]  # (sender, envelope, tick) -> lost?


class LossyBus(MessageBus):
    """The bus, losing exactly the messages ``drop`` names; every sent message is recorded."""

    def __init__(self, *args, drop: Drop, **kwargs) -> None:
        self.drop, self.sent = drop, []
        super().__init__(*args, **kwargs)

    def send(self, src: str, envelopes: list[Envelope]) -> None:
        kept = []
        for envelope in envelopes:
            self.sent.append((self.now, src, envelope))
            if self.drop(src, envelope, self.now):
                self.messages += 1
            else:
                kept.append(envelope)
        super().send(src, kept)


def backward_refreshes(src: str, dst: str, start: int, end: int) -> Drop:
    return lambda s, e, now: (s == src and e.dst == dst and isinstance(e.message, Refresh)
                              and start <= now < end)


def converged(drop: Drop) -> tuple[LossyBus, list]:
    bus = LossyBus(two_stage_line(capacity_1=2), seed=1, check_every_tick=True, drop=drop)
    bus.run(max_ticks=300, quiet_ticks=40)
    paths = sorted(bus.routing())
    assert len(paths) == 2
    return bus, paths


def test_a_working_unit_outlives_one_ttl_of_lost_refreshes() -> None:
    ttl = FlowParams().soft_state_ttl_ticks
    window: list[int] = []
    bus, paths = converged(lambda s, e, now: bool(window) and backward_refreshes("r2", "r1", *window)(s, e, now))
    window += [bus.now, bus.now + ttl + 6]  # every refresh r2 sends r1, for more than a TTL
    changes = 0
    for _ in range(3 * ttl):
        bus.step()
        changes += sorted(bus.routing()) != paths
    assert changes == 0 and bus.violations == []
    asked = [m for t, s, m in bus.sent if s == "r1" and m.dst == "r2" and isinstance(m.message, Refresh)
             and window[0] + ttl < t < window[1]]
    assert asked  # r1 asked r2 for the late refresh
    assert not [m for _t, s, m in bus.sent if isinstance(m.message, Cancel)]


def test_a_unit_never_refreshed_again_is_dropped_after_a_second_ttl() -> None:
    ttl = FlowParams().soft_state_ttl_ticks
    start: list[int] = []
    bus, _paths = converged(lambda s, e, now: bool(start)
                            and backward_refreshes("r2", "r1", start[0], 10**9)(s, e, now))
    start.append(bus.now)
    for _ in range(ttl + 2):
        bus.step()
    assert len(bus.routing()) == 2  # late by one TTL: asked for, not dropped
    for _ in range(ttl + 4):
        bus.step()
    cancels = [t for t, s, m in bus.sent if s == "r1" and isinstance(m.message, Cancel) and t >= start[0]]
    assert cancels and min(cancels) - start[0] > 2 * ttl  # dropped (r2 told) only after the second TTL
    assert bus.violations == []


def test_a_lost_request_is_asked_again_not_cancelled() -> None:
    lost: list[int] = []

    def first_request(s: str, e: Envelope, now: int) -> bool:
        if s == "dh" and isinstance(e.message, Request) and not lost:
            lost.append(now)
            return True
        return False

    bus = LossyBus(two_stage_line(capacity_1=2), seed=1, check_every_tick=True, drop=first_request)
    bus.run(max_ticks=300, quiet_ticks=40)
    requests = [m.message for _t, s, m in bus.sent if s == "dh" and isinstance(m.message, Request)]
    assert lost and len(bus.routing()) == 2 and bus.violations == []
    assert len(requests) >= 2 and requests[1].edge_ids == requests[0].edge_ids  # the same units asked again
    assert not [m for _t, s, m in bus.sent if s == "dh" and isinstance(m.message, Cancel)]
