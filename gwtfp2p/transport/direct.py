"""The direct data channel: forwards and backwards over plain TCP beside libp2p, peers authenticated through it.

libp2p carries every byte through both nodes' p2pd (two unix-socket hops, TLS and yamux in Go); a
direct TCP connection between the two Python processes moves a tensor straight from the sender's
memory into the receiver's (docs/transport.md, ``bench_rpc.py``). A connection is set up through
libp2p: the client asks the server for a ticket (``{namespace}.direct``, a unary call on the secure
channel); the server answers its TCP port and hosts, a one-time token bound to the caller's
authenticated peer id and a proof. The client connects (to the IP its libp2p connection to the server
uses, else the hosts) and sends the token; the server answers the proof. The connection then carries
that peer's transfers, one at a time: a method frame, the transfer as on a libp2p stream, the reply.
The bytes are neither encrypted nor MAC'd. A peer is first reached over libp2p while a direct
connection is tried in the background; where none can be made, transfers stay on libp2p.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hivemind.p2p import P2P, P2PContext
from hivemind.proto import runtime_pb2

from gwtfp2p.transport.errors import TransportError
from gwtfp2p.transport.framing import SocketSource, StreamClosed, frame
from gwtfp2p.transport.messages import MAX_META_BYTES, DirectTicket, Reply

logger = logging.getLogger(__name__)
TOKEN_BYTES = 32
TICKET_TTL_S = 30.0
MAX_TICKETS = 1024
MAX_CONNECTIONS = 256  # served at once, over all peers
HANDSHAKE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 120.0  # a server closes a connection idle this long (the client opens another)
CONNECT_TIMEOUT_S = 3.0
CLOSE_TIMEOUT_S = 5.0  # a server's close waits this long for its connections' tasks to end
RETRY_AFTER_S = 60.0  # a peer that could not be reached directly is tried again after this long
MAX_PER_PEER = 8  # a client's direct connections to one peer (more transfers at once go over libp2p)
METHODS = ("forward", "backward")
_ERRORS = (ConnectionError, OSError, EOFError, asyncio.IncompleteReadError)


def handler_name(namespace: str) -> str:
    return f"{namespace}.direct"


class Tickets:
    """One-time tokens a server issued, each bound to the peer that asked for it (pure bookkeeping)."""

    def __init__(self, ttl_s: float = TICKET_TTL_S, capacity: int = MAX_TICKETS) -> None:
        self.ttl_s, self.capacity = ttl_s, capacity
        self._issued: dict[bytes, tuple[str, bytes, float]] = {}  # token -> (peer, proof, expiry)

    def issue(self, peer_id: str, now: float) -> tuple[bytes, bytes]:
        """A new (token, proof) for ``peer_id``; the oldest tickets go when there are too many."""
        self._issued = {t: v for t, v in self._issued.items() if v[2] > now}
        while len(self._issued) >= self.capacity:
            self._issued.pop(next(iter(self._issued)))
        token, proof = secrets.token_bytes(TOKEN_BYTES), secrets.token_bytes(TOKEN_BYTES)
        self._issued[token] = (peer_id, proof, now + self.ttl_s)
        return token, proof

    def redeem(self, token: bytes, now: float) -> tuple[str, bytes] | None:
        """(peer id, proof) of an unexpired token, which is then spent; None for any other bytes."""
        entry = self._issued.pop(token, None)
        return None if entry is None or entry[2] <= now else (entry[0], entry[1])


class DirectServer:
    """Accepts direct connections of authenticated peers and serves their transfers with ``transfer_reply``."""

    def __init__(self, p2p: P2P, transfer_reply: Callable[..., Awaitable[Reply]], namespace: str,
                 host: str, hosts: tuple[str, ...], part_timeout_s: float) -> None:
        self.p2p, self.transfer_reply, self.name = p2p, transfer_reply, handler_name(namespace)
        self.hosts, self.part_timeout_s = hosts, part_timeout_s
        self.tickets = Tickets()
        self.listener = socket.create_server((host, 0), backlog=128)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self._connections: dict[asyncio.Task, socket.socket] = {}  # serving task -> its connection
        self._accepting: asyncio.Task | None = None
        self.transfers = 0  # served over direct connections (tests, benchmarks)

    async def start(self) -> None:
        await self.p2p.add_protobuf_handler(self.name, self._ticket, runtime_pb2.ExpertRequest)
        self._accepting = asyncio.create_task(self._accept(), name="direct-accept")

    async def _ticket(self, _request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        token, proof = self.tickets.issue(context.remote_id.to_base58(), time.monotonic())
        ticket = DirectTicket(port=self.port, hosts=self.hosts, token=token.hex(), proof=proof.hex())
        return runtime_pb2.ExpertResponse(metadata=Reply(direct=ticket).model_dump_json().encode())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.listener)
            if len(self._connections) >= MAX_CONNECTIONS:
                conn.close()
                continue
            task = asyncio.create_task(self._serve(conn))
            self._connections[task] = conn
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        self._connections.pop(task, None)

    async def _serve(self, conn: socket.socket) -> None:
        loop, source = asyncio.get_running_loop(), SocketSource(conn)
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            token = bytearray(TOKEN_BYTES)
            await source.read_into(memoryview(token), HANDSHAKE_TIMEOUT_S)
            redeemed = self.tickets.redeem(bytes(token), time.monotonic())
            if redeemed is None:
                return
            peer, proof = redeemed
            await asyncio.wait_for(loop.sock_sendall(conn, proof), HANDSHAKE_TIMEOUT_S)
            while True:
                method = (await source.frame(16, IDLE_TIMEOUT_S, peer)).decode(errors="replace")
                if method not in METHODS:
                    return
                reply = await self.transfer_reply(method, peer, source)
                self.transfers += 1
                payload = frame(reply.model_dump_json().encode())
                await asyncio.wait_for(loop.sock_sendall(conn, payload), self.part_timeout_s)
                if not reply.ok:  # the tensor may be unread: the stream is out of step, end it
                    return
        except (*_ERRORS, asyncio.TimeoutError, StreamClosed) as e:
            logger.debug("direct connection ended: %r", e)
        except Exception:
            logger.exception("direct connection failed")
        finally:
            conn.close()

    async def close(self) -> None:
        """Stop serving within ``CLOSE_TIMEOUT_S``. Every open connection is shut before its task is cancelled:
        a cancellation can be lost (``asyncio.wait_for`` returns its inner call's result when that completes as
        the cancellation comes, and the task goes on to wait for the next frame, up to ``IDLE_TIMEOUT_S``); on a
        shut socket that wait ends at once."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.p2p.remove_protobuf_handler(self.name), 5.0)
        for conn in self._connections.values():
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        tasks = [t for t in (self._accepting, *self._connections) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            if pending:
                logger.warning("direct channel: %d connections still served %.0f s after close; left behind",
                               len(pending), CLOSE_TIMEOUT_S)
        self.listener.close()


class DirectFailed(Exception):
    """The direct connection broke before the reply came: the transfer goes over libp2p instead."""


Delay = Callable[[int, bool], Awaitable[None]]  # (bytes, include latency): the link emulation's wait


async def exchange(sock: socket.socket, method: str, header: bytes, payload: memoryview, delay: Delay | None,
                   part_bytes: int) -> bytes:
    """One transfer on a direct connection: the method, the header frame and the payload go out while the
    reply frame is awaited (a server that refuses early answers before reading everything)."""
    loop = asyncio.get_running_loop()

    async def send() -> None:
        if delay is not None:
            await delay(len(header), True)
        await loop.sock_sendall(sock, frame(method.encode()) + frame(header))
        step = part_bytes if delay is not None else max(1, len(payload))
        for start in range(0, len(payload), step):
            if delay is not None:
                await delay(min(step, len(payload) - start), False)
            await loop.sock_sendall(sock, payload[start:start + step])

    sending = asyncio.ensure_future(send())
    reading = asyncio.ensure_future(SocketSource(sock).frame(MAX_META_BYTES, None))
    try:
        await asyncio.wait({sending, reading}, return_when=asyncio.FIRST_EXCEPTION)
        if sending.done() and sending.exception() is not None and not reading.done():
            raise DirectFailed(f"sending failed: {sending.exception()!r}")
        return await reading
    except (*_ERRORS, StreamClosed) as e:
        raise DirectFailed(repr(e)) from e
    finally:
        for task in (sending, reading):
            task.cancel()
        await asyncio.gather(sending, reading, return_exceptions=True)


@dataclass
class Lease:
    """A direct connection lent for one transfer; ``keep`` False closes it afterwards."""

    sock: socket.socket
    keep: bool = True


def listen_hosts(maddrs: list[str]) -> tuple[str, tuple[str, ...]]:
    """Where a server listens (loopback if libp2p listens only there, else every IPv4 interface) and the
    hosts its tickets name, from its libp2p addresses (relay circuits skipped)."""
    ips = [m.split("/")[2] for m in maddrs if m.split("/")[1:2] == ["ip4"] and "p2p-circuit" not in m]
    ips = list(dict.fromkeys(ip for ip in ips if ip != "0.0.0.0"))[:8]
    bind = "127.0.0.1" if ips and all(ip.startswith("127.") for ip in ips) else "0.0.0.0"
    return bind, tuple(ips)


async def open_server(p2p: P2P, transfer_reply: Callable[..., Awaitable[Reply]], namespace: str,
                      part_timeout_s: float) -> DirectServer:
    """A started ``DirectServer`` on ``p2p``'s node (its ticket handler registered)."""
    bind, hosts = listen_hosts([str(m) for m in await p2p.get_visible_maddrs()])
    server = DirectServer(p2p, transfer_reply, namespace, bind, hosts, part_timeout_s)
    await server.start()
    return server


@dataclass
class _Peer:
    idle: list[socket.socket] = field(default_factory=list)
    open: int = 0  # connections made and not closed
    reachable: bool = False  # a direct connection was made once
    retry_at: float = 0.0  # no attempt before (after a failed one)
    trying: bool = False


class DirectClient:
    """A client's direct connections, by peer; ``connection`` yields one or None (then use libp2p)."""

    def __init__(self, ask_ticket: Callable[[str], Awaitable[DirectTicket]],
                 peer_ips: Callable[[str], Awaitable[list[str]]]) -> None:
        self.ask_ticket = ask_ticket  # a ticket from the peer, over libp2p
        self.peer_ips = peer_ips  # the IPs our libp2p connections to the peer use
        self._peers: dict[str, _Peer] = {}
        self._background: set[asyncio.Task] = set()
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self, peer_id: str):
        """A connection to ``peer_id`` for one transfer (back to the pool only if the transfer completed),
        or None: no direct connection now (being tried in the background, or unreachable)."""
        state = self._peers.setdefault(peer_id, _Peer())
        conn = state.idle.pop() if state.idle else None
        if conn is None and state.reachable and state.open < MAX_PER_PEER:
            conn = await self._open_now(peer_id, state)
        elif conn is None and not state.reachable and not state.trying and time.monotonic() >= state.retry_at:
            self._spawn(self._try(peer_id, state))
        lease = Lease(conn) if conn is not None else None
        completed = False
        try:
            yield lease
            completed = True
        finally:
            if lease is not None:
                if completed and lease.keep and not self._closed:
                    state.idle.append(lease.sock)
                else:
                    state.open -= 1
                    lease.sock.close()

    async def _open_now(self, peer_id: str, state: _Peer) -> socket.socket | None:
        try:
            conn = await self._connect(peer_id)
        except (*_ERRORS, asyncio.TimeoutError, StreamClosed, TransportError) as e:
            logger.debug("direct connection to %s failed: %r", peer_id, e)
            state.reachable, state.retry_at = False, time.monotonic() + RETRY_AFTER_S
            return None
        state.open += 1
        return conn

    async def _try(self, peer_id: str, state: _Peer) -> None:
        state.trying = True
        try:
            conn = await self._open_now(peer_id, state)
            if conn is not None:
                state.reachable = True
                state.idle.append(conn)
                logger.info("direct data channel to %s open", peer_id)
        finally:
            state.trying = False

    async def _connect(self, peer_id: str) -> socket.socket:
        ticket = await asyncio.wait_for(self.ask_ticket(peer_id), HANDSHAKE_TIMEOUT_S)
        hosts = list(dict.fromkeys([*await self.peer_ips(peer_id), *ticket.hosts]))
        loop, last = asyncio.get_running_loop(), None
        for host in hosts:
            conn = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            conn.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(conn, (host, ticket.port)), CONNECT_TIMEOUT_S)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await asyncio.wait_for(loop.sock_sendall(conn, bytes.fromhex(ticket.token)), HANDSHAKE_TIMEOUT_S)
                proof = bytearray(TOKEN_BYTES)
                await SocketSource(conn).read_into(memoryview(proof), HANDSHAKE_TIMEOUT_S)
                if bytes(proof) != bytes.fromhex(ticket.proof):
                    raise ConnectionError("the direct channel answered the wrong proof")
                return conn
            except BaseException as e:
                conn.close()
                last = e
                if not isinstance(e, (*_ERRORS, asyncio.TimeoutError, StreamClosed)):
                    raise
        raise ConnectionError(f"no host of {peer_id} took a direct connection ({last!r})")

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for state in self._peers.values():
            for conn in state.idle:
                conn.close()
            state.idle.clear()
