"""Wire metadata of the transport's RPCs (pydantic, versioned, strictly validated: peers are untrusted).

``TransferMeta`` travels with every forward/backward tensor (inside ``TransferHeader``); ``Ack`` is
the receiver's answer; ``Reply`` is the envelope of every answer (success or a typed error);
``StateHeader`` precedes a state download. Raw tensor and state bytes follow their headers
outside these models (``codec.py``, ``framing.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gwtfp2p.config import WIRE_CODECS
from gwtfp2p.ids import PeerId
from gwtfp2p.transport.codec import TensorHeader
from gwtfp2p.transport.errors import ProtocolError, RemoteErrorKind

WIRE_VERSION = 1
MAX_META_BYTES = 16 * 1024
MAX_PATH_HOPS = 64
MAX_TAGS = 16

Stage = Annotated[int, Field(ge=0, le=1024)]
TagKey = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")]
TagValue = bool | int | float | Annotated[str, Field(max_length=128)]
CodecName = Literal[WIRE_CODECS]  # type: ignore[valid-type]

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class MicrobatchId(BaseModel):
    """Names one microbatch: its data holder, iteration and index (docs/design.md §3)."""

    model_config = _STRICT

    data_holder: PeerId
    iteration: Annotated[int, Field(ge=0, le=2**53)]
    index: Annotated[int, Field(ge=0, le=1_000_000)]

    @property
    def key(self) -> str:
        """A compact string id, handy as a dict key and in logs."""
        return f"{self.data_holder}/{self.iteration}/{self.index}"


class TransferMeta(BaseModel):
    """Metadata of one forward activation or backward gradient transfer."""

    model_config = _STRICT

    version: Literal[1] = WIRE_VERSION
    microbatch: MicrobatchId
    stage: Stage  # the stage the receiver serves for this hop (0: the data holder as tail/sink)
    flow_unit: Annotated[str, Field(max_length=64, pattern=r"^[\x20-\x7e]*$")] = ""  # opaque route tag
    path: Annotated[tuple[PeerId, ...], Field(max_length=MAX_PATH_HOPS)] = ()  # hops so far, source first
    attempt: Annotated[int, Field(ge=0, le=1000)] = 0  # resend count (recovery)
    tags: Annotated[dict[TagKey, TagValue], Field(max_length=MAX_TAGS)] = Field(default_factory=dict)
    codec: CodecName = "none"  # how the tensor travels (compression.py): the transport encodes and decodes it


class TransferHeader(BaseModel):
    """First frame of a forward/backward stream; the tensor's raw bytes follow."""

    model_config = _STRICT

    version: Literal[1] = WIRE_VERSION
    meta: TransferMeta
    tensor: TensorHeader


class Ack(BaseModel):
    """The receiver's immediate answer to a transfer: received (and accepted or not)."""

    model_config = _STRICT

    accepted: bool = True
    duplicate: bool = False  # the receiver already holds this microbatch id (docs/design.md §3 recovery)
    reason: Annotated[str, Field(max_length=200)] = ""


class PingInfo(BaseModel):
    """What a ping answers: the nonce back and the peer's wall-clock time (clock-skew check)."""

    model_config = _STRICT

    nonce: Annotated[int, Field(ge=0, lt=2**63)]
    peer_time: Annotated[float, Field(ge=0.0, le=1e11)]


class StateHeader(BaseModel):
    """Precedes a state download: what follows and how to check it."""

    model_config = _STRICT

    stage: Stage
    iteration: Annotated[int, Field(ge=0, le=2**53)]
    size_bytes: Annotated[int, Field(ge=0, le=2**40)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class FetchRequest(BaseModel):
    model_config = _STRICT

    version: Literal[1] = WIRE_VERSION
    stage: Stage
    since_iteration: Annotated[int, Field(ge=0)] | None = None  # the steps since then, not the state


class DirectTicket(BaseModel):
    """Where and how to open a direct data channel to the answering peer (``direct.py``): its TCP port and
    host addresses, the one-time ``token`` that names us there, and the ``proof`` it answers with.
    Both secrets travel only in this answer, over libp2p's authenticated, encrypted channel."""

    model_config = _STRICT

    port: Annotated[int, Field(ge=1, le=65535)]
    hosts: Annotated[tuple[Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[0-9A-Fa-f:.]+$")], ...],
                     Field(max_length=8)] = ()
    token: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    proof: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Reply(BaseModel):
    """Envelope of every answer: ``ok`` with at most one payload, or an error ``kind`` + message."""

    model_config = _STRICT

    version: Literal[1] = WIRE_VERSION
    ok: bool = True
    kind: RemoteErrorKind | None = None
    message: Annotated[str, Field(max_length=500)] = ""
    ack: Ack | None = None
    ping: PingInfo | None = None
    state: StateHeader | None = None
    direct: DirectTicket | None = None

    @classmethod
    def error(cls, kind: RemoteErrorKind, message: str) -> Reply:
        return cls(ok=False, kind=kind, message=message[:500])


@dataclass(frozen=True)
class StateBlob:
    """A stage's serialized weights + optimizer state, as the daemon hands it to the transport."""

    stage: int
    iteration: int
    data: bytes


@dataclass(frozen=True)
class FetchedState:
    """A downloaded state whose size and sha256 were checked against the sender's header."""

    stage: int
    iteration: int
    data: bytes
    sha256: str


@dataclass(frozen=True)
class PingResult:
    """Round trip time to a peer and the estimated offset of its clock from ours (peer − local)."""

    rtt_s: float
    clock_offset_s: float


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_wire(model: type[ModelT], raw: bytes, peer_id: str = "") -> ModelT:
    """Parse untrusted JSON bytes into ``model`` or raise ``ProtocolError`` (never ``assert``)."""
    if len(raw) > MAX_META_BYTES:
        raise ProtocolError(f"{model.__name__} of {len(raw)} bytes exceeds {MAX_META_BYTES}", peer_id)
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0] if errors else {"loc": (), "msg": str(e)}
        where = ".".join(str(part) for part in first["loc"]) or model.__name__
        raise ProtocolError(f"invalid {model.__name__}: {where}: {first['msg']}", peer_id) from e
