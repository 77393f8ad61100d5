"""The direct data channel's pure parts: one-time tickets bound to a peer, and where a server listens."""

from __future__ import annotations

import pytest

from gwtfp2p.transport.direct import Tickets, listen_hosts

pytestmark = pytest.mark.timeout(30)


def test_a_ticket_names_its_peer_once_until_it_expires():
    tickets = Tickets(ttl_s=30.0)
    token, proof = tickets.issue("QmAlice", now=0.0)
    other, _ = tickets.issue("QmBob", now=1.0)
    assert len(token) == len(proof) == 32 and token != other
    assert tickets.redeem(b"\0" * 32, now=2.0) is None
    assert tickets.redeem(token, now=2.0) == ("QmAlice", proof)
    assert tickets.redeem(token, now=2.0) is None  # spent
    assert tickets.redeem(other, now=31.0) is None  # expired


def test_tickets_are_bounded():
    tickets = Tickets(ttl_s=30.0, capacity=4)
    issued = [tickets.issue(f"Qm{i}", now=float(i))[0] for i in range(6)]
    assert [tickets.redeem(t, now=7.0) is not None for t in issued] == [False, False, True, True, True, True]


def test_listen_hosts_from_the_libp2p_addresses():
    local = ["/ip4/127.0.0.1/tcp/4001/p2p/QmX"]
    assert listen_hosts(local) == ("127.0.0.1", ("127.0.0.1",))
    public = ["/ip4/10.216.0.2/tcp/4001", "/ip4/127.0.0.1/tcp/4001", "/ip4/0.0.0.0/tcp/4001",
              "/ip4/1.2.3.4/tcp/1/p2p/QmR/p2p-circuit/p2p/QmX", "/ip6/::1/tcp/4001"]
    assert listen_hosts(public) == ("0.0.0.0", ("10.216.0.2", "127.0.0.1"))
