"""The reachability verdict (``swarm/reachability.decide``): direct, relayed, unknown, and ``--announce`` errors."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.daemon.config import NetworkConfig
from gwtfp2p.daemon.swarm.reachability import (
    AnnounceError,
    Check,
    Reachability,
    decide,
    fixed_port,
    needs_check,
    relay_maddr,
)
from gwtfp2p.dht.probe import SwarmPeer
from gwtfp2p.transport.dialback import DialBackAnswer, DialResult

PEER = "12D3KooWPeerAxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
OBSERVED = "/ip4/10.77.0.12/tcp/4002"


def peer(name: str, relayed: bool = False) -> SwarmPeer:
    peer_id = f"12D3KooW{name.ljust(40, 'x')}"
    maddr = f"/ip4/10.77.0.{len(name) + 20}/tcp/4000/p2p/{peer_id}"
    if relayed:
        maddr = f"/ip4/10.77.0.2/tcp/4000/p2p/{PEER}/p2p-circuit/p2p/{peer_id}"
    return SwarmPeer(peer_id, (maddr,), relayed)


def answer(*results: tuple[str, bool], observed: str = OBSERVED) -> DialBackAnswer:
    return DialBackAnswer(observed=observed, results=tuple(DialResult(maddr=m, ok=ok, error="" if ok else "refused")
                                                           for m, ok in results))


def test_most_checkers_reached_us_direct_and_announce_what_they_dialed():
    checks = [Check(peer("a"), answer((OBSERVED, True))), Check(peer("bb"), answer((OBSERVED, True))),
              Check(peer("ccc"), answer((OBSERVED, False)))]
    result = decide(checks, ())
    assert result.verdict == "direct"
    assert result.announce == (OBSERVED,)
    assert (result.asked, result.answered, result.reached) == (3, 3, 2)


def test_nobody_reached_us_relayed_through_the_directly_reachable_checkers_only():
    checks = [Check(peer("a"), answer((OBSERVED, False))), Check(peer("bb", relayed=True), answer((OBSERVED, False))),
              Check(peer("ccc"), answer((OBSERVED, False)))]
    result = decide(checks, ())
    assert result.verdict == "relayed"
    assert len(result.relays) == 2 and all("p2p-circuit" not in r for r in result.relays)
    assert result.relays[0].endswith(f"/p2p/{peer('a').peer_id}")


def test_half_is_not_a_majority():
    checks = [Check(peer("a"), answer((OBSERVED, True))), Check(peer("bb"), answer((OBSERVED, False)))]
    assert decide(checks, ()).verdict == "relayed"


def test_no_conclusive_answer_is_unknown():
    checks = [Check(peer("a"), None, "not a gwtf node"), Check(peer("bb"), DialBackAnswer(refused="busy")),
              Check(peer("ccc"), DialBackAnswer(observed=""))]  # relayed request: nothing to dial
    result = decide(checks, ())
    assert result.verdict == "unknown"
    assert result.answered == 0 and len(result.errors) == 3


def test_an_announce_address_nobody_could_dial_is_an_error_naming_it():
    announce = "/ip4/203.0.113.7/tcp/31337"
    checks = [Check(peer("a"), answer((announce, False), (OBSERVED, True)))]
    with pytest.raises(AnnounceError, match="--announce: none of the 1 peer"):
        decide(checks, (announce,))


def test_a_dialable_announce_address_is_kept():
    announce = "/ip4/203.0.113.7/tcp/31337"
    result = decide([Check(peer("a"), answer((announce, True)))], (announce,))
    assert result.verdict == "direct" and result.announce == (announce,)


def test_relayed_verdict_gives_p2pd_static_relays():
    options = Reachability("relayed", relays=("/ip4/1.2.3.4/tcp/1/p2p/" + PEER,)).relay_options(NetworkConfig())
    assert options.mode == "relayed" and options.trusted_relays == ("/ip4/1.2.3.4/tcp/1/p2p/" + PEER,)
    public = Reachability("direct").relay_options(NetworkConfig(relay_for_others=False))
    assert public.mode == "public" and public.serve is False


def test_relay_address_skips_loopback_and_circuits():
    p = SwarmPeer(PEER, ("/ip4/127.0.0.1/tcp/1", f"/ip4/9.9.9.9/tcp/1/p2p/{PEER}/p2p-circuit", "/ip4/8.8.8.8/tcp/5"),
                  False)
    assert relay_maddr(p) == f"/ip4/8.8.8.8/tcp/5/p2p/{PEER}"
    assert relay_maddr(SwarmPeer(PEER, ("/ip4/127.0.0.1/tcp/1",), False)) == ""


def test_only_nodes_listening_beyond_loopback_with_peers_are_checked():
    peers = ("/ip4/10.0.0.1/tcp/1/p2p/" + PEER,)
    assert needs_check(NetworkConfig(host="0.0.0.0", initial_peers=peers))
    assert not needs_check(NetworkConfig(host="127.0.0.1", initial_peers=peers))
    assert not needs_check(NetworkConfig(host="0.0.0.0"))
    assert not needs_check(NetworkConfig(host="0.0.0.0", initial_peers=peers, reachability="direct"))


def test_port_zero_becomes_a_free_port_the_probe_and_the_node_share():
    port = fixed_port("127.0.0.1", 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # it is free
    assert fixed_port("127.0.0.1", 31337) == 31337


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=6))
def test_verdict_is_direct_exactly_when_a_strict_majority_of_conclusive_checks_reached_us(outcomes):
    checks = [Check(peer("p" * (i + 1)), answer((OBSERVED, ok)) if conclusive else None)
              for i, (conclusive, ok) in enumerate(outcomes)]
    conclusive = [ok for conclusive, ok in outcomes if conclusive]
    verdict = decide(checks, ()).verdict
    if not conclusive:
        assert verdict == "unknown"
    else:
        assert (verdict == "direct") == (2 * sum(conclusive) > len(conclusive))
