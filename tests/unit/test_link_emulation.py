"""Link emulation: geo10 table, delay = scale × (latency + size / bandwidth), location handling."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from gwtfp2p.config import ConfigError
from gwtfp2p.flow.geo import GIB, geo10
from gwtfp2p.transport.link_emulation import LinkEmulator, canonical_location

PEER_A = "12D3KooWEEKNFHzs7nSD3qG5DLxASVLuwVJ4WANjMzc1Y7r2bCKf"
PEER_B = "12D3KooWAZrpVn1HLK8X78Wxjsb5xQXn8CKwmT5GF2jxrD8Pg9Wy"
pytestmark = pytest.mark.timeout(30)


def test_every_geo10_pair_can_be_emulated():
    table = geo10()
    assert len(table.locations) == 10 and "Oregon" in table.locations and "Sydney" in table.locations
    for a, b in itertools.combinations(table.locations, 2):
        latency_s, bandwidth = table.link(a, b)
        assert (latency_s, bandwidth) == table.link(b, a)
        assert 0 < latency_s < 1 and bandwidth > 0
        emulator = LinkEmulator(a.upper())
        emulator.set_peer_location(PEER_B, b.lower())
        assert emulator.delay_s(PEER_B, 0) == pytest.approx(latency_s)
    assert table.link("Tokyo", "Tokyo") == (0.001, 2.0 * GIB)
    assert canonical_location(table, " sydney ") == "Sydney"


def test_delay_follows_the_geo10_transfer_model():
    emulator = LinkEmulator("Oregon", scale=0.5)
    emulator.set_peer_location(PEER_B, "Virginia")
    size = 16 * 2**20
    expected = 0.5 * (0.067 + size / (0.395 * GIB))
    assert emulator.delay_s(PEER_B, size) == pytest.approx(expected)
    assert emulator.delay_s(PEER_B, size, include_latency=False) == pytest.approx(0.5 * size / (0.395 * GIB))
    assert emulator.delay_s(PEER_B, 0) == pytest.approx(0.5 * 0.067)


def test_same_location_uses_local_link_and_unknown_peers_are_not_delayed():
    emulator = LinkEmulator("tokyo")  # case-insensitive
    assert emulator.own_location == "Tokyo"
    assert emulator.delay_s(PEER_A, 10**6) == 0.0  # location unknown
    emulator.set_peer_location(PEER_A, "TOKYO")
    assert emulator.peer_location(PEER_A) == "Tokyo"
    assert emulator.delay_s(PEER_A, 2 * GIB) == pytest.approx(0.001 + 1.0)
    emulator.set_peer_location(PEER_A, "Atlantis")  # unknown name: forget, do not crash
    assert emulator.peer_location(PEER_A) is None and emulator.delay_s(PEER_A, 100) == 0.0
    emulator.set_peer_location(PEER_B, "Seoul")
    emulator.set_peer_location(PEER_B, None)
    assert emulator.delay_s(PEER_B, 100) == 0.0


def test_scale_zero_disables_delays():
    emulator = LinkEmulator("Sydney", scale=0.0)
    emulator.set_peer_location(PEER_A, "London")
    assert emulator.delay_s(PEER_A, 10**9) == 0.0


@pytest.mark.parametrize("location, scale, flag", [("Atlantis", 1.0, "--location"), ("Oregon", -1.0, "--link-scale"),
                                                   ("Oregon", float("inf"), "--link-scale")])
def test_bad_configuration_names_the_flag(location, scale, flag):
    with pytest.raises(ConfigError, match=flag):
        LinkEmulator(location, scale=scale)


def test_async_delay_sleeps_at_least_the_emulated_time():
    emulator = LinkEmulator("Oregon", scale=0.5)
    emulator.set_peer_location(PEER_B, "Sydney")
    expected = emulator.delay_s(PEER_B, 4096)
    assert 0.05 < expected < 0.2

    async def measure() -> float:
        started = time.monotonic()
        await emulator.delay(PEER_B, 4096)
        await emulator.delay(PEER_A, 4096)  # unknown location: returns at once
        return time.monotonic() - started

    elapsed = asyncio.run(measure())
    assert expected <= elapsed < expected + 1.0
