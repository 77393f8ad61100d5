"""Reachability dial-back: a node asks peers of the swarm to open a *new* connection to it.

Petals' ``check_direct_reachability`` is the idea: whether a peer can dial me cannot be learned over
a connection I opened (libp2p reuses it), so the checker dials from a fresh, listen-less libp2p host
of its own (``probe_host``), closed after the check. The checker dials only the IP address it
observed the request come from (with the ports the asker listens on), plus at most two ``--announce``
addresses, one dial at a time per asker; the answer says what it observed and what each dial did.
``DialBackService`` serves it on a node's p2pd; ``ask_dialback`` asks from any hivemind ``P2P``
(the joining node's probe). Messages are JSON in the transport's unary envelope, strictly parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Annotated

from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.proto import runtime_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gwtfp2p.transport.errors import PeerTimeout, PeerUnreachable, ProtocolError, TransportError, dial_error
from gwtfp2p.transport.maddrs import for_p2pd

logger = logging.getLogger(__name__)
MAX_PORTS = 4
MAX_ANNOUNCE = 2
MAX_CHECKS_AT_ONCE = 4
_IP_TCP = re.compile(r"^/(ip4|ip6)/([^/]+)/tcp/(\d+)")
Maddr = Annotated[str, Field(min_length=2, max_length=160, pattern=r"^/[\x21-\x7e]+$")]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class DialBackRequest(BaseModel):
    model_config = _STRICT

    ports: Annotated[tuple[Annotated[int, Field(ge=1, le=65535)], ...], Field(max_length=MAX_PORTS)] = ()
    announce: Annotated[tuple[Maddr, ...], Field(max_length=MAX_ANNOUNCE)] = ()


class DialResult(BaseModel):
    model_config = _STRICT

    maddr: Maddr
    ok: bool
    error: Annotated[str, Field(max_length=300)] = ""


class DialBackAnswer(BaseModel):
    model_config = _STRICT

    observed: Annotated[str, Field(max_length=160)] = ""  # the address the request came from ("" if relayed)
    results: Annotated[tuple[DialResult, ...], Field(max_length=MAX_PORTS + MAX_ANNOUNCE)] = ()
    refused: Annotated[str, Field(max_length=200)] = ""  # why the check was not done (busy, ...)


def handler_name(namespace: str) -> str:
    return f"{namespace}.dialback"


def observed_ip(maddrs: list[str]) -> tuple[str, str] | None:
    """(ip4|ip6, address) of the first direct TCP address among a connection's remote addresses."""
    for maddr in maddrs:
        match = _IP_TCP.match(maddr)
        if match and "/p2p-circuit" not in maddr:
            return match.group(1), match.group(2)
    return None


def candidates(request: DialBackRequest, observed: tuple[str, str] | None) -> list[str]:
    """What the checker dials, in order: the announced addresses, then the observed IP at each port."""
    out = [m for m in request.announce if _IP_TCP.match(m)]
    if observed is not None:
        out += [f"/{observed[0]}/{observed[1]}/tcp/{port}" for port in request.ports]
    return list(dict.fromkeys(out))


async def probe_host(timeout_s: float) -> P2P:
    """A libp2p host that listens nowhere and relays nothing: a dial from it is a brand new connection."""
    return await P2P.create(no_listen=True, use_relay=False, auto_nat=False, nat_port_map=False,
                            dht_mode="client", startup_timeout=timeout_s)


class DialBackService:
    """Serves dial-back checks on a node's p2pd (registered by ``Transport.start``)."""

    def __init__(self, p2p: P2P, namespace: str, dial_timeout_s: float) -> None:
        self.p2p = p2p
        self.name = handler_name(namespace)
        self.dial_timeout_s = dial_timeout_s
        self._checking: set[str] = set()
        self._slots = asyncio.Semaphore(MAX_CHECKS_AT_ONCE)

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(self.name, self._handle, runtime_pb2.ExpertRequest)

    async def unregister(self) -> None:
        with contextlib.suppress(Exception):
            await self.p2p.remove_protobuf_handler(self.name)

    async def _handle(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        sender = context.remote_id
        try:
            parsed = DialBackRequest.model_validate_json(bytes(request.metadata))
        except ValidationError as e:
            return _response(DialBackAnswer(refused=f"bad request: {e.errors()[0]['msg']}"[:200]))
        if sender.to_base58() in self._checking or self._slots.locked():
            return _response(DialBackAnswer(refused="busy: one check per peer at a time"))
        self._checking.add(sender.to_base58())
        try:
            async with self._slots:
                return _response(await self.check(sender, parsed))
        finally:
            self._checking.discard(sender.to_base58())

    async def check(self, sender: PeerID, request: DialBackRequest) -> DialBackAnswer:
        """Dial ``sender`` back from a fresh host: the announced addresses, then the observed IP."""
        remote = [str(a) for info in await self.p2p.list_peers() if info.peer_id == sender for a in info.addrs]
        seen = observed_ip(remote)
        observed = next((m for m in remote if seen and f"/{seen[1]}/" in m), "")
        results = []
        probe = await probe_host(self.dial_timeout_s * 2)
        try:
            reached = False
            for maddr in candidates(request, seen):
                if reached and maddr not in request.announce:
                    break  # one working address is the verdict; announced ones are each checked
                ok, error = await _dial(probe, sender, maddr, self.dial_timeout_s)
                results.append(DialResult(maddr=maddr, ok=ok, error=error[:300]))
                reached = reached or ok
        finally:
            await probe.shutdown()
        return DialBackAnswer(observed=observed[:160], results=tuple(results))


async def _dial(probe: P2P, peer: PeerID, maddr: str, timeout_s: float) -> tuple[bool, str]:
    try:
        await asyncio.wait_for(probe._client.connect(peer, [for_p2pd(maddr)]), timeout_s)  # no public connect()
    except asyncio.TimeoutError:
        return False, f"no answer within {timeout_s:.0f} s"
    except Exception as e:
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__
    return True, ""


def _response(answer: DialBackAnswer) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=answer.model_dump_json().encode())


async def connect_peer(p2p: P2P, peer_id: str, maddrs: tuple[str, ...], timeout_s: float) -> None:
    """Open a connection from ``p2p`` to ``peer_id`` at addresses from its record (relay circuits too)."""
    try:
        peer = PeerID.from_base58(peer_id)
        addrs = [for_p2pd(m, dial_peer=peer_id) for m in maddrs]
    except Exception as e:
        raise PeerUnreachable(f"bad peer id or address for {peer_id}: {e}", peer_id) from e
    try:
        await asyncio.wait_for(p2p._client.connect(peer, addrs), timeout_s)  # hivemind has no public connect()
    except asyncio.TimeoutError as e:
        raise PeerTimeout(f"connecting to {peer_id} took over {timeout_s:.1f} s", peer_id) from e
    except Exception as e:
        raise PeerUnreachable(f"cannot connect to {peer_id}: {dial_error(e)}", peer_id) from e


async def ask_dialback(p2p: P2P, peer_id: str, request: DialBackRequest, *, namespace: str,
                       timeout_s: float) -> DialBackAnswer:
    """Ask ``peer_id`` to dial us back; ``TransportError`` if it cannot be asked (not a gwtf node, gone)."""
    try:
        peer = PeerID.from_base58(peer_id)
    except Exception as e:
        raise PeerUnreachable(f"{peer_id!r} is not a peer id", peer_id) from e
    try:
        response = await asyncio.wait_for(p2p.call_protobuf_handler(
            peer, handler_name(namespace), runtime_pb2.ExpertRequest(metadata=request.model_dump_json().encode()),
            runtime_pb2.ExpertResponse), timeout_s)
    except asyncio.TimeoutError as e:
        raise PeerUnreachable(f"dial-back check by {peer_id}: no answer within {timeout_s:.0f} s", peer_id) from e
    except Exception as e:
        raise PeerUnreachable(f"dial-back check by {peer_id}: {str(e).splitlines()[0][:200] if str(e) else e!r}",
                              peer_id) from e
    try:
        return DialBackAnswer.model_validate_json(bytes(response.metadata))
    except ValidationError as e:
        raise ProtocolError(f"malformed dial-back answer from {peer_id}", peer_id) from e


__all__ = ["DialBackAnswer", "DialBackRequest", "DialBackService", "DialResult", "TransportError", "ask_dialback",
           "connect_peer"]
