"""The direct data channel: one-time tickets bound to a peer, where a server listens, and a server's close
(a real server on 127.0.0.1 with a fake libp2p handle)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from gwtfp2p.transport.direct import CLOSE_TIMEOUT_S, DirectServer, Tickets, listen_hosts
from gwtfp2p.transport.framing import frame
from gwtfp2p.transport.messages import Reply

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


class _FakeP2P:
    async def add_protobuf_handler(self, *_args, **_kwargs) -> None:
        return None

    async def remove_protobuf_handler(self, *_args, **_kwargs) -> None:
        return None


def test_close_ends_a_connection_whose_task_lost_its_cancellation():
    """A stop that hung 40 s in a flake hunt (test_metrics, at 19e29e5): ``DirectServer.close`` cancelled its
    connections' tasks and gathered them, and three were waiting, uncancelled, for their peer's next frame
    (up to IDLE_TIMEOUT_S). A cancellation can be lost: ``asyncio.wait_for`` returns its inner call's result
    when that completes as the cancellation comes. Here the transfer's handler loses it the same way; the
    server's close must still end the connection at once."""
    async def main() -> tuple[bool, int]:
        entered = asyncio.Event()

        async def handler_that_loses_the_cancellation(_method: str, _peer: str, _source) -> Reply:
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            return Reply()

        server = DirectServer(_FakeP2P(), handler_that_loses_the_cancellation, "test", "127.0.0.1",
                              ("127.0.0.1",), part_timeout_s=5.0)
        await server.start()
        loop = asyncio.get_running_loop()
        token, proof = server.tickets.issue("QmPeer", time.monotonic())
        client = socket.create_connection(("127.0.0.1", server.port))
        client.setblocking(False)
        try:
            await loop.sock_sendall(client, token)
            assert await asyncio.wait_for(loop.sock_recv(client, len(proof)), 5) == proof
            await loop.sock_sendall(client, frame(b"forward"))
            await asyncio.wait_for(entered.wait(), 5)
            started = time.monotonic()
            await asyncio.wait_for(server.close(), 2 * CLOSE_TIMEOUT_S)
            return time.monotonic() - started < CLOSE_TIMEOUT_S, len(server._connections)
        finally:
            client.close()

    in_time, still_served = asyncio.run(main())
    assert in_time and still_served == 0
