"""``hello``: which protocol versions a gwtf node speaks, asked before joining through it.

Nodes of different gwtf versions may not read each other's records or messages at all (a newer record
is refused by an older validator), so a joining node would only see "no run" after its deadline.
Every node's transport answers ``hello`` with the versions its daemon gave it (``Transport.start``);
a joining node asks its initial peers first (``ask_hello``) and stops with a clear error on a
mismatch. A peer without the handler (a stock ``hivemind-dht`` bootstrap) is not a gwtf node: it
answers nothing and is skipped. JSON in the unary envelope, strictly parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Annotated

from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.proto import runtime_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gwtfp2p.transport.errors import PeerUnreachable, ProtocolError

VersionName = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_.-]+$")]


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    versions: Annotated[dict[VersionName, Annotated[int, Field(ge=0, le=1_000_000)]], Field(max_length=16)]


def handler_name(namespace: str) -> str:
    return f"{namespace}.hello"


class HelloService:
    """Answers ``hello`` on a node's p2pd with ``versions``."""

    def __init__(self, p2p: P2P, namespace: str, versions: Mapping[str, int]) -> None:
        self.p2p = p2p
        self.name = handler_name(namespace)
        self.answer = runtime_pb2.ExpertResponse(metadata=Hello(versions=dict(versions)).model_dump_json().encode())

    async def register(self) -> None:
        await self.p2p.add_protobuf_handler(self.name, self._handle, runtime_pb2.ExpertRequest)

    async def unregister(self) -> None:
        with contextlib.suppress(Exception):
            await self.p2p.remove_protobuf_handler(self.name)

    async def _handle(self, _request: runtime_pb2.ExpertRequest, _context: P2PContext) -> runtime_pb2.ExpertResponse:
        return self.answer


async def ask_hello(p2p: P2P, peer_id: str, *, namespace: str, timeout_s: float) -> Hello:
    """``peer_id``'s versions; ``PeerUnreachable`` if it does not answer (gone, or not a gwtf node)."""
    try:
        peer = PeerID.from_base58(peer_id)
    except Exception as e:
        raise PeerUnreachable(f"{peer_id!r} is not a peer id", peer_id) from e
    try:
        response = await asyncio.wait_for(p2p.call_protobuf_handler(
            peer, handler_name(namespace), runtime_pb2.ExpertRequest(), runtime_pb2.ExpertResponse), timeout_s)
    except asyncio.TimeoutError as e:
        raise PeerUnreachable(f"hello to {peer_id}: no answer within {timeout_s:.0f} s", peer_id) from e
    except Exception as e:
        raise PeerUnreachable(f"hello to {peer_id}: {str(e).splitlines()[0][:200] if str(e) else e!r}",
                              peer_id) from e
    try:
        return Hello.model_validate_json(bytes(response.metadata))
    except ValidationError as e:
        raise ProtocolError(f"malformed hello answer from {peer_id}", peer_id) from e
