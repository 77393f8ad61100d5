"""Pure parts of joining from home: p2pd's relay options, the default identity file, error texts, and
multiaddrs encoded as p2pd (Go) reads them."""

from __future__ import annotations

import asyncio
import os
import socket
import stat

import pytest
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from gwtfp2p.dht.diagnose import diagnose_peers, p2pd_message, tcp_endpoint
from gwtfp2p.dht.identity import NodeKey
from gwtfp2p.dht.identity_file import default_identity_path, open_default_identity
from gwtfp2p.dht.p2pd_options import RelayOptions, extra_p2pd_args
from gwtfp2p.dht.rejoin import dialable
from gwtfp2p.transport.maddrs import circuit_via, for_p2pd, is_relayed

RELAY = "QmWTgR67LqQ56U9XX4s56i6GnMWirn8jfteNxY8KciZxMp"
PEER = "12D3KooWH7NYvRnFXHzCrrrhyiT2MK8E6DTS2SnMq9GLCZ4APq4w"


def flags(**kwargs) -> list[str]:
    return P2P._make_process_args("p2pd", **kwargs)


def test_public_nodes_get_relay_limits_relayed_ones_static_relays_and_other_p2pds_nothing():
    public = RelayOptions(mode="public", max_circuits=8)
    assert public.hivemind_kwargs() == {"force_reachability": "public"}
    with extra_p2pd_args(public):
        assert "-relayMaxCircuits=8" in flags(forceReachabilityPublic=True)
        assert "-relayTimeLimit=21600s" in flags(forceReachabilityPublic=True)
        assert not any("relayMax" in f for f in flags(dhtClient=True))  # e.g. hivemind's identity check
    relayed = RelayOptions(mode="relayed", trusted_relays=(f"/ip4/1.2.3.4/tcp/1/p2p/{RELAY}",))
    assert relayed.hivemind_kwargs()["client_mode"] is True
    with extra_p2pd_args(relayed):
        assert "-relayDiscovery=0" in flags(autoRelay=True, trustedRelays="x")
        assert "-relayDiscovery=0" not in flags(autoRelay=True)  # p2pd would panic without trusted relays
    assert not any("relayDiscovery" in f for f in flags(autoRelay=True, trustedRelays="x"))  # outside: untouched


def test_relay_options_are_validated():
    with pytest.raises(ValueError, match="relayed node needs"):
        RelayOptions(mode="relayed")
    with pytest.raises(ValueError):
        RelayOptions(mode="nat")


def test_the_default_identity_is_created_0600_locked_and_a_second_node_gets_a_temporary_one(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    first = open_default_identity(env)
    try:
        assert first.persistent and first.path == str(default_identity_path(env))
        assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(first.path)).st_mode) == 0o700
        peer_id = NodeKey.load(first.path).peer_id
        second = open_default_identity(env)
        assert not second.persistent and second.path != first.path
        assert NodeKey.load(second.path).peer_id != peer_id
        second.close()
        assert not os.path.exists(second.path)
    finally:
        first.close()
    again = open_default_identity(env)  # a restarted node: the same key, the same peer id
    assert again.persistent and NodeKey.load(again.path).peer_id == peer_id
    again.close()


def test_xdg_data_home_or_the_home_directory():
    assert str(default_identity_path({"XDG_DATA_HOME": "/x"})) == "/x/gwtf/identity.key"
    assert str(default_identity_path({"HOME": "/home/v"})) == "/home/v/.local/share/gwtf/identity.key"


def test_p2pd_messages_lose_hivemind_prefix_and_go_timestamps():
    text = ("Daemon failed to start: 2026/12/01 18:22:42 failed to listen on any addresses: "
            "[listen tcp4 10.1.1.1:0: bind: cannot assign requested address]")
    assert p2pd_message(text).startswith("failed to listen on any addresses")
    assert p2pd_message('Daemon failed to start: {"level":"fatal","msg":"bad key","error":"EOF"}') == "bad key: EOF"
    assert p2pd_message("goroutine 1\npanic: Found staticRelays\nmain.go:225") == "panic: Found staticRelays"


def test_each_initial_peer_is_diagnosed_by_a_tcp_connect():
    assert tcp_endpoint(f"/ip4/1.2.3.4/tcp/31337/p2p/{PEER}") == ("1.2.3.4", 31337)
    assert tcp_endpoint("/ip4/1.2.3.4/udp/1") is None
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        open_port, closed_port = listening.getsockname()[1], closed.getsockname()[1]
        lines = asyncio.run(diagnose_peers([f"/ip4/127.0.0.1/tcp/{open_port}/p2p/{PEER}",
                                            f"/ip4/127.0.0.1/tcp/{closed_port}/p2p/{PEER}", "/unix/x"], 1.0))
    assert "libp2p handshake failed" in lines[0] and f":{open_port}" in lines[0]
    assert "connection refused" in lines[1]
    assert "not a TCP address" in lines[2]


def test_circuit_addresses_carry_the_relay_id_as_a_multihash_like_p2pd_expects():
    relay = f"/ip4/10.77.0.2/tcp/4000/p2p/{RELAY}"
    circuit = circuit_via(relay, PEER)
    assert is_relayed(circuit) and circuit.endswith(f"/p2p-circuit/p2p/{PEER}")
    encoded = for_p2pd(circuit, dial_peer=PEER)
    multihash = PeerID.from_base58(RELAY).to_bytes()
    expected = (Multiaddr("/ip4/10.77.0.2/tcp/4000").to_bytes() + bytes([0xA5, 0x03, len(multihash)]) + multihash
                + Multiaddr("/p2p-circuit").to_bytes())
    assert encoded.to_bytes() == expected  # varint 421 = a5 03: /p2p/, then the raw multihash
    assert for_p2pd(f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}", dial_peer=PEER).to_bytes() == Multiaddr(
        "/ip4/1.2.3.4/tcp/5").to_bytes()
    with pytest.raises(ValueError):
        circuit_via(circuit, PEER)


def test_rejoin_dials_direct_addresses_with_an_id_only():
    targets = dialable([f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}", f"/ip4/1.2.3.4/tcp/5/p2p/{RELAY}/p2p-circuit/p2p/{PEER}",
                        "/ip4/1.2.3.4/tcp/6", f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}"])
    assert targets == [(PEER, "/ip4/1.2.3.4/tcp/5")]
