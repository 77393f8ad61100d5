"""Transfer deadlines on a slow home uplink (found on a 10 Mbit/s ``tc tbf`` link: four 1 MiB forwards sent at
once each took 3.5 s, every one timed out at the 2 s floor, so no transfer ever completed, the bandwidth was
never measured, and every retry timed out alike): a transfer's deadline covers the bytes already in flight on
the node's uplink, and a timeout bounds the link's bandwidth estimate, so the next deadline is long enough.
A fake transport with an injected uplink model; no network."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.sending import Sender
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.transport import Ack, MicrobatchId, PeerTimeout, TransferMeta
from gwtfp2p.transport.compression import WireCodecs
from tests.unit.daemon.fakes import DH, PA

MIB = 1 << 20
UPLINK_BYTES_PER_S = 1.25e6  # 10 Mbit/s
TENSOR = torch.zeros(MIB // 4)  # 1 MiB of float32


class SharedUplink:
    """Transfers share one uplink: each takes (the bytes in flight when it starts) / rate, in fake time;
    one whose deadline is shorter times out after its deadline."""

    link = None

    def __init__(self) -> None:
        self.deadlines: list[float] = []
        self.in_flight = 0

    async def forward(self, peer: str, meta: TransferMeta, tensor: torch.Tensor, *, timeout_s: float) -> Ack:
        self.deadlines.append(timeout_s)
        self.in_flight += MIB
        try:
            needed_s = self.in_flight / UPLINK_BYTES_PER_S
            await asyncio.sleep(min(needed_s, timeout_s) / 1000)  # fake time: a thousandth
            if needed_s > timeout_s:
                raise PeerTimeout(f"forward to {peer}: no answer within {timeout_s:.2f} s", peer)
            return Ack()
        finally:
            self.in_flight -= MIB


def meta(index: int) -> TransferMeta:
    return TransferMeta(microbatch=MicrobatchId(data_holder=DH, iteration=0, index=index), stage=1)


def sender(transport: SharedUplink, links: LinkTable) -> Sender:
    timings = Timings()
    return Sender(transport, links, Deadlines(timings), timings, on_failure=lambda _peer: None, codecs=WireCodecs())


def test_a_deadline_covers_the_bytes_queued_ahead_on_the_uplink() -> None:
    links = LinkTable(default_bandwidth_bytes_per_s=UPLINK_BYTES_PER_S)
    transport = SharedUplink()
    node = sender(transport, links)

    async def four_at_once() -> list:
        return await asyncio.gather(*(node.send("forward", PA, meta(i), TENSOR) for i in range(4)))

    acks = asyncio.run(four_at_once())
    assert all(a is not None and a.accepted for a in acks)
    floor, factor = Timings().transfer_floor_s, Timings().timeout_factor
    expected = [max(floor, factor * (k * MIB / UPLINK_BYTES_PER_S)) for k in (1, 2, 3, 4)]
    assert transport.deadlines == pytest.approx(expected)  # the 4th waits behind three
    assert node.in_flight_bytes == 0


def test_a_timeout_on_a_link_never_measured_lengthens_the_next_deadline() -> None:
    links = LinkTable(default_bandwidth_bytes_per_s=1e9)  # the default estimate: far above a home uplink
    transport = SharedUplink()
    node = sender(transport, links)

    async def four_at_once() -> list:
        return await asyncio.gather(*(node.send("forward", PA, meta(i), TENSOR) for i in range(4)))

    acks = asyncio.run(four_at_once())
    assert all(a is not None and a.accepted for a in acks), "the retries got deadlines long enough"
    assert transport.deadlines[:4] == [Timings().transfer_floor_s] * 4  # the first tries: the floor
    assert min(transport.deadlines[4:]) > Timings().transfer_floor_s  # a timeout bounded the estimate
    assert links.bandwidth(PA) < 1e9 and node.in_flight_bytes == 0


def test_a_timeout_only_ever_lowers_the_estimate() -> None:
    links = LinkTable(default_bandwidth_bytes_per_s=1e9)
    links.observe_timeout(PA, 4 * MIB, 2.0)
    assert links.bandwidth(PA) == pytest.approx(2 * MIB)
    links.observe_timeout(PA, 4 * MIB, 1.0)  # a weaker bound: the estimate stays
    assert links.bandwidth(PA) == pytest.approx(2 * MIB)
    links.observe_timeout(PA, 1000, 2.0)  # too small to say anything about bandwidth
    assert links.bandwidth(PA) == pytest.approx(2 * MIB)
    assert Deadlines(Timings()).transfer_s(None, 4 * MIB, links.bandwidth(PA)) == pytest.approx(8.0)
