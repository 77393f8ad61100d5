"""Wire records stored in the DHT: the run spec and one record per node, versioned and strictly validated.

DHT values come from untrusted peers: every field is bounded (sizes, finite numbers, patterns) and
parsing returns a typed record or raises ``RecordError`` (never ``assert``). Encoded records stay well
under hivemind's 16 KiB argument limit (``MAX_RECORD_BYTES``). This module owns no I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gwtfp2p.config import RunSpec

RECORD_VERSION = 1
MAX_RECORD_BYTES = 12 * 1024  # hard cap of one encoded record; a worst-case valid NodeRecord fits
MAX_LINKS = 32  # neighbours with RTT/bandwidth figures in one node record
MAX_ROUTES = 32  # routing-summary entries in one node record
MAX_MADDRS = 6
MAX_STAGE = 1024
RUN_ID_HEX_CHARS = 16

PeerIdStr = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
"""A libp2p peer id in base58 (``12D3KooW…`` or ``Qm…``)."""
RunIdStr = Annotated[str, Field(pattern=rf"^[0-9a-f]{{{RUN_ID_HEX_CHARS}}}$")]
Maddr = Annotated[str, Field(min_length=2, max_length=160, pattern=r"^/[\x21-\x7e]+$")]
NonNegFloat = Annotated[float, Field(ge=0.0, le=1e15)]
Location = Annotated[str, Field(max_length=32, pattern=r"^[A-Za-z0-9_-]*$")]

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
# JSON input is parsed in JSON mode, where strict still accepts arrays for tuples.


class RecordError(ValueError):
    """A DHT value is not a valid record of the expected kind (garbage, wrong version, too large)."""


def canonical_spec_json(spec: RunSpec) -> str:
    """The canonical JSON of a run spec: sorted keys, no whitespace (what the run id hashes)."""
    return json.dumps(asdict(spec), sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_id_of(spec: RunSpec) -> str:
    """Short hash naming a run: the first 16 hex digits of sha256 of the canonical spec JSON."""
    return hashlib.sha256(canonical_spec_json(spec).encode()).hexdigest()[:RUN_ID_HEX_CHARS]


class RunSpecRecord(BaseModel):
    """The run spec as published by the first data holder of a run (``gwtf/<run_id>/spec``)."""

    model_config = _STRICT

    version: Literal[1] = RECORD_VERSION
    spec: RunSpec
    published_by: PeerIdStr | None = None

    @classmethod
    def from_spec(cls, spec: RunSpec, published_by: str | None = None) -> RunSpecRecord:
        return cls(spec=spec, published_by=published_by)

    def to_spec(self) -> RunSpec:
        return self.spec

    @property
    def run_id(self) -> str:
        return run_id_of(self.spec)


class LinkStats(BaseModel):
    """Measured figures of the link to one neighbour."""

    model_config = _STRICT

    rtt_s: Annotated[float, Field(ge=0.0, le=600.0)]
    bandwidth_bytes_per_s: NonNegFloat = 0.0


class RouteSummary(BaseModel):
    """One line of a node's routing: ``units`` flow units towards ``sink`` go to ``next_peer``."""

    model_config = _STRICT

    next_peer: PeerIdStr
    sink: PeerIdStr
    units: Annotated[int, Field(ge=0, le=1_000_000)]


class NodeRecord(BaseModel):
    """What a node publishes about itself under ``gwtf/<run_id>/nodes`` (subkey = its peer id)."""

    model_config = _STRICT

    version: Literal[1] = RECORD_VERSION
    run_id: RunIdStr
    peer_id: PeerIdStr
    role: Literal["data", "relay"]
    stage: Annotated[int, Field(ge=0, le=MAX_STAGE)]
    state: Literal["joining", "online", "leaving"]
    capacity: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    compute_s: Annotated[float, Field(ge=0.0, le=86_400.0)] = 0.0
    maddrs: Annotated[tuple[Maddr, ...], Field(max_length=MAX_MADDRS)] = ()
    iteration: Annotated[int, Field(ge=0, le=2**53)] = 0
    location: Location = ""
    links: Annotated[dict[PeerIdStr, LinkStats], Field(max_length=MAX_LINKS)] = Field(default_factory=dict)
    routing: Annotated[tuple[RouteSummary, ...], Field(max_length=MAX_ROUTES)] = ()
    weight_hash: Annotated[str, Field(max_length=64, pattern=r"^[0-9a-f]*$")] = ""
    loss: Annotated[float, Field(ge=-1e6, le=1e6)] | None = None
    tokens_per_s: NonNegFloat = 0.0
    updated_at: Annotated[float, Field(ge=0.0, le=1e11)] = 0.0

    @model_validator(mode="after")
    def _role_matches_stage(self) -> NodeRecord:
        if self.role == "data" and self.stage != 0:
            raise ValueError(f"a data holder serves stage 0, got stage {self.stage}")
        if self.role == "relay" and self.stage < 1:
            raise ValueError("a relay serves a stage >= 1")
        return self


RecordT = TypeVar("RecordT", RunSpecRecord, NodeRecord)


def encode_record(record: RunSpecRecord | NodeRecord) -> bytes:
    """Encode a record as compact JSON bytes; ``RecordError`` if it exceeds ``MAX_RECORD_BYTES``."""
    raw = record.model_dump_json().encode()
    if len(raw) > MAX_RECORD_BYTES:
        name = type(record).__name__
        raise RecordError(f"{name} is {len(raw)} bytes, over the {MAX_RECORD_BYTES} byte cap")
    return raw


def _parse(model: type[RecordT], raw: object) -> RecordT:
    if not isinstance(raw, (bytes, bytearray, str)):
        raise RecordError(f"expected an encoded {model.__name__}, got {type(raw).__name__}")
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{model.__name__} of {len(raw)} bytes exceeds the {MAX_RECORD_BYTES} byte cap")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0] if errors else {"loc": (), "msg": str(e)}
        where = ".".join(str(part) for part in first["loc"]) or "record"
        raise RecordError(f"invalid {model.__name__}: {where}: {first['msg']}") from e


def parse_run_spec_record(raw: object) -> RunSpecRecord:
    """Parse an encoded run spec record or raise ``RecordError``."""
    return _parse(RunSpecRecord, raw)


def parse_node_record(raw: object) -> NodeRecord:
    """Parse an encoded node record or raise ``RecordError``."""
    return _parse(NodeRecord, raw)
