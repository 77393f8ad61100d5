"""Typed errors of the transport: every failed call raises exactly one of these.

``PeerUnreachable``: no connection (dial failed, peer gone, stream cut). ``PeerTimeout``: no answer
before the deadline. ``RemoteError``: the peer answered with an error (``kind`` says which).
``ProtocolError``: the peer (or a local caller) sent something malformed.
"""

from __future__ import annotations

from typing import Literal, get_args

RemoteErrorKind = Literal["bad_request", "unavailable", "busy", "internal"]
REMOTE_ERROR_KINDS: tuple[str, ...] = get_args(RemoteErrorKind)


class TransportError(RuntimeError):
    """Base class of every error raised by ``gwtfp2p.transport``; ``peer_id`` names the peer."""

    def __init__(self, message: str, peer_id: str = ""):
        super().__init__(message)
        self.peer_id = peer_id


class PeerUnreachable(TransportError):
    """The peer could not be dialled, or the connection broke mid-call."""


class PeerTimeout(TransportError):
    """The call did not complete before its deadline (``timeout_s``)."""


class RemoteError(TransportError):
    """The peer refused or failed the request; ``kind`` is one of ``REMOTE_ERROR_KINDS``.

    ``bad_request``: the peer rejected what we sent as malformed or too large; ``unavailable``: it
    has nothing to serve (no state for that stage); ``busy``: its handler missed the server-side
    deadline; ``internal``: its handler failed.
    """

    def __init__(self, message: str, peer_id: str = "", kind: str = "internal"):
        super().__init__(message, peer_id)
        self.kind = kind


class ProtocolError(TransportError):
    """Malformed data: bad metadata, a tensor that does not match its header, a hash mismatch."""



def dial_error(e: BaseException, limit: int = 600) -> str:
    """p2pd's error on one line: a failed dial's first line says only "all dials failed", the lines under it
    say why each address failed (no route, refused, the relay's refusal), which is what a reader needs."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "; ".join(lines)[:limit] if lines else type(e).__name__
