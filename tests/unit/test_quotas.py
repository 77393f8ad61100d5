"""A server's per-peer shares: one peer's streams and bytes are bounded, the others keep theirs."""

from __future__ import annotations

import pytest

from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.quotas import PeerQuotas


def test_one_peer_cannot_take_every_slot() -> None:
    quotas = PeerQuotas(max_streams_per_peer=3, max_peer_bytes=100)
    assert [quotas.take_stream("mallory") for _ in range(5)] == [True, True, True, False, False]
    assert quotas.take_stream("alice") and quotas.streams("alice") == 1
    quotas.give_stream("mallory")
    assert quotas.take_stream("mallory") and not quotas.take_stream("mallory")


def test_bytes_in_memory_are_bounded_per_peer() -> None:
    quotas = PeerQuotas(max_streams_per_peer=3, max_peer_bytes=100)
    assert quotas.take_bytes("mallory", 60) and not quotas.take_bytes("mallory", 41)
    assert quotas.take_bytes("alice", 100)
    quotas.give_bytes("mallory", 60)
    assert quotas.take_bytes("mallory", 100)


def test_limits_keep_a_share_below_the_whole() -> None:
    limits = TransportLimits()
    assert limits.max_streams_per_peer < limits.max_inflight_streams
    with pytest.raises(ValueError):
        TransportLimits(max_streams_per_peer=65, max_inflight_streams=64)
