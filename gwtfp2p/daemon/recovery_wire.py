"""Data-plane recovery messages on ``send_flow`` (``b"R"`` + JSON; pydantic, strict: peers are untrusted).

* ``Lost(microbatch, lost)``: sent by a node whose gradient could not reach its previous hop
  ``lost`` to the nearest live hop upstream of it (the one that keeps the output it sent to
  ``lost``): resend it to another replica, and route it to me (the sender) to rejoin.
* ``Where(microbatches, lost)``: the upstream hop asks downstream nodes which of these microbatches
  they hold state for with ``lost`` on their recorded path.
* ``Held(microbatches, lost, stage)``: the answer (possibly empty).
Owns the encoding only; ``recovery.py`` and the data paths act on them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gwtfp2p.transport import MicrobatchId

RECOVERY_TAG = b"R"
MAX_RECOVERY_BYTES = 64 * 1024
MAX_MICROBATCHES = 256

PeerIdStr = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
Microbatches = Annotated[tuple[MicrobatchId, ...], Field(max_length=MAX_MICROBATCHES)]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Lost(BaseModel):
    model_config = _STRICT
    kind: Literal["lost"] = "lost"
    microbatch: MicrobatchId
    lost: PeerIdStr
    stage: Annotated[int, Field(ge=0, le=1024)]  # the stage the sender serves (0: a data holder's tail)


class Where(BaseModel):
    model_config = _STRICT
    kind: Literal["where"] = "where"
    microbatches: Microbatches
    lost: PeerIdStr


class Held(BaseModel):
    model_config = _STRICT
    kind: Literal["held"] = "held"
    microbatches: Microbatches
    lost: PeerIdStr
    stage: Annotated[int, Field(ge=0, le=1024)]


RecoveryMessage = Lost | Where | Held
_ADAPTER = TypeAdapter(Annotated[RecoveryMessage, Field(discriminator="kind")])


class RecoveryWireError(ValueError):
    """A malformed recovery message."""


def is_recovery(payload: bytes) -> bool:
    return payload[:1] == RECOVERY_TAG


def encode_recovery(message: RecoveryMessage) -> bytes:
    return RECOVERY_TAG + message.model_dump_json().encode()


def decode_recovery(payload: bytes) -> RecoveryMessage:
    body = payload[1:]
    if payload[:1] != RECOVERY_TAG or len(body) > MAX_RECOVERY_BYTES:
        raise RecoveryWireError("not a recovery message, or too large")
    try:
        return _ADAPTER.validate_json(body)
    except ValidationError as e:
        raise RecoveryWireError(f"bad recovery message: {e.errors()[0]['msg'] if e.errors() else e}") from e
