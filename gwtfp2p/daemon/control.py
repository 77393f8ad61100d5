"""Daemon control messages and the framing shared with flow-protocol messages on ``send_flow``.

One ``send_flow`` payload is either ``b"F"`` + flow messages (``gwtfp2p.flow.wire``, one per line)
or ``b"C"`` + one control message (JSON, pydantic, strictly validated: peers are untrusted):
``Member`` (I take part in stage aggregation from/until an iteration), ``MemberAnswer`` (accepted,
or your state is stale) and ``Closed`` (a data holder closed an iteration; carries the swarm's
loss). Owns the encoding only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gwtfp2p.flow.messages import Message
from gwtfp2p.flow.wire import WireError, decode_message, encode_message

FLOW_TAG = b"F"
CONTROL_TAG = b"C"
MAX_CONTROL_BYTES = 16 * 1024

Iteration = Annotated[int, Field(ge=0, le=2**53)]
Stage = Annotated[int, Field(ge=0, le=1024)]
PeerIdStr = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ControlError(ValueError):
    """A payload that is neither valid flow messages nor a valid control message."""


class Member(BaseModel):
    """The sender aggregates with ``stage`` from ``from_iteration`` to ``until_iteration`` (None: open)."""

    model_config = _STRICT
    kind: Literal["member"] = "member"
    stage: Stage
    from_iteration: Iteration
    until_iteration: Iteration | None = None


class MemberAnswer(BaseModel):
    """Answer to ``Member``: ``stale`` when the receiver already aggregated ``from_iteration``."""

    model_config = _STRICT
    kind: Literal["member_answer"] = "member_answer"
    stage: Stage
    from_iteration: Iteration
    accepted: bool
    receiver_iteration: Iteration


class Closed(BaseModel):
    """Every live data holder closed ``iteration`` and stepped; the swarm's figures for it."""

    model_config = _STRICT
    kind: Literal["closed"] = "closed"
    iteration: Iteration
    data_holders: Annotated[tuple[PeerIdStr, ...], Field(max_length=256)]
    loss: Annotated[float, Field(ge=-1e6, le=1e6)] | None = None
    microbatches: Annotated[int, Field(ge=0, le=10**9)] = 0
    tokens_per_s: Annotated[float, Field(ge=0.0, le=1e15)] = 0.0


Control = Member | MemberAnswer | Closed
_CONTROL = TypeAdapter(Annotated[Control, Field(discriminator="kind")])


def encode_flow(messages: list[Message]) -> bytes:
    return FLOW_TAG + b"\n".join(encode_message(m) for m in messages)


def encode_control(message: Control) -> bytes:
    return CONTROL_TAG + message.model_dump_json().encode()


def decode_payload(payload: bytes) -> list[Message] | Control:
    """Flow messages (a list) or one control message; ``ControlError`` on anything malformed."""
    tag, body = payload[:1], payload[1:]
    if tag == FLOW_TAG:
        try:
            return [decode_message(line) for line in body.split(b"\n") if line]
        except WireError as e:
            raise ControlError(f"bad flow message: {e}") from e
    if tag == CONTROL_TAG:
        if len(body) > MAX_CONTROL_BYTES:
            raise ControlError(f"control message of {len(body)} bytes exceeds {MAX_CONTROL_BYTES}")
        try:
            return _CONTROL.validate_json(body)
        except ValidationError as e:
            raise ControlError(f"bad control message: {e.errors()[0]['msg'] if e.errors() else e}") from e
    raise ControlError(f"unknown payload tag {tag!r}")
