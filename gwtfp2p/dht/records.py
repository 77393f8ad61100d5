"""Wire records stored in the DHT: the run spec and one record per node, versioned and strictly validated.

DHT values come from untrusted peers: every field is bounded (sizes, finite numbers, patterns) and
parsing returns a typed record or raises ``RecordError`` (never ``assert``). Encoded records stay well
under hivemind's 16 KiB argument limit (``MAX_RECORD_BYTES``). This module owns no I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gwtfp2p.config import RunSpec
from gwtfp2p.ids import PeerId

RECORD_VERSION = 1
MAX_RECORD_BYTES = 12800  # hard cap of one encoded record (a worst-case valid NodeRecord fits; sealed < 14 KB)
MAX_LINKS = 32  # neighbours with RTT/bandwidth figures in one node record
MAX_ROUTES = 32  # routing-summary entries in one node record
MAX_MADDRS = 6
MAX_EXCLUDED = 3  # peers a node excluded for misbehaviour, shown in its record
MAX_STAGE = 1024
RUN_ID_HEX_CHARS = 16
MAX_RECENT_HASHES = 16  # (iteration, state hash) pairs in one node record
RECENT_STEPS = 8  # of them: the last steps in a row ...
HASH_ANCHOR_STRIDE = 8  # ... and the latest iterations that are multiples of this (see ``pick_recent_hashes``)
HASH_HISTORY_STEPS = 72  # steps a node keeps to choose from: its 8th latest multiple of 8 is at most 71 back

RunIdStr = Annotated[str, Field(pattern=rf"^[0-9a-f]{{{RUN_ID_HEX_CHARS}}}$")]
Maddr = Annotated[str, Field(min_length=2, max_length=160, pattern=r"^/[\x21-\x7e]+$")]
NonNegFloat = Annotated[float, Field(ge=0.0, le=1e15)]
Location = Annotated[str, Field(max_length=32, pattern=r"^[A-Za-z0-9_-]*$")]
Iteration = Annotated[int, Field(ge=0, le=2**53)]
StateHash = Annotated[str, Field(max_length=64, pattern=r"^[0-9a-f]*$")]
StepHash = Annotated[str, Field(min_length=1, max_length=16, pattern=r"^[0-9a-f]*$")]  # a part's state hash
PublicKeyB64 = Annotated[str, Field(max_length=1400, pattern=r"^[A-Za-z0-9+/]*={0,2}$")]

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
    published_by: PeerId | None = None

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

    next_peer: PeerId
    sink: PeerId
    units: Annotated[int, Field(ge=0, le=1_000_000)]


class ExcludedPeer(BaseModel):
    """A peer this node excluded for misbehaviour (``daemon/swarm/exclusions.py``), and the evidence."""

    model_config = _STRICT

    peer: PeerId
    reason: Annotated[str, Field(max_length=96)]


class NodeRecord(BaseModel):
    """What a node publishes about itself under ``gwtf/<run_id>/nodes`` (subkey = its peer id)."""

    model_config = _STRICT

    version: Literal[1] = RECORD_VERSION
    run_id: RunIdStr
    peer_id: PeerId
    role: Literal["data", "relay"]
    stage: Annotated[int, Field(ge=0, le=MAX_STAGE)]
    state: Literal["joining", "online", "leaving"]
    capacity: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    compute_s: Annotated[float, Field(ge=0.0, le=86_400.0)] = 0.0
    maddrs: Annotated[tuple[Maddr, ...], Field(max_length=MAX_MADDRS)] = ()
    iteration: Iteration = 0
    location: Location = ""
    links: Annotated[dict[PeerId, LinkStats], Field(max_length=MAX_LINKS)] = Field(default_factory=dict)
    routing: Annotated[tuple[RouteSummary, ...], Field(max_length=MAX_ROUTES)] = ()
    weight_hash: StateHash = ""
    recent_hashes: Annotated[tuple[tuple[Iteration, StepHash], ...], Field(max_length=MAX_RECENT_HASHES)] = ()
    """(iteration, state hash after the step of that iteration), iterations strictly increasing; chosen
    by ``pick_recent_hashes`` so that replicas whose records are a few steps apart share an iteration.
    Records of daemons that predate the field parse with it empty."""
    loss: Annotated[float, Field(ge=-1e6, le=1e6)] | None = None
    tokens_per_s: NonNegFloat = 0.0
    updated_at: Annotated[float, Field(ge=0.0, le=1e11)] = 0.0
    excluded: Annotated[tuple[ExcludedPeer, ...], Field(max_length=MAX_EXCLUDED)] = ()
    """The latest peers this node excluded (a liar caught by a cross-check, a hop that delivers nothing)."""
    public_key: PublicKeyB64 = ""
    """The node's identity public key (base64 libp2p protobuf), as the signature of its stored record
    proved it: filled in by the reader (``SwarmDHT.read_nodes``), never stored (empty on the wire)."""

    @model_validator(mode="after")
    def _consistent(self) -> NodeRecord:
        if self.role == "data" and self.stage != 0:
            raise ValueError(f"a data holder serves stage 0, got stage {self.stage}")
        if self.role == "relay" and self.stage < 1:
            raise ValueError("a relay serves a stage >= 1")
        iterations = [iteration for iteration, _ in self.recent_hashes]
        if any(b <= a for a, b in itertools.pairwise(iterations)):
            raise ValueError("recent_hashes: iterations must be strictly increasing")
        if any(not h for _, h in self.recent_hashes):
            raise ValueError("recent_hashes: empty state hash")
        return self


MAX_ADMITTED = 200  # peers a permissioned run's creator admits (one record: ~10 KB)


class AdmittedRecord(BaseModel):
    """A permissioned run's admitted peers, as its creator publishes them (``gwtf/<run_id>/admitted``)."""

    model_config = _STRICT

    version: Literal[1] = RECORD_VERSION
    run_id: RunIdStr
    peers: Annotated[tuple[PeerId, ...], Field(max_length=MAX_ADMITTED)]


def parse_admitted_record(raw: object) -> AdmittedRecord:
    """Parse an encoded admitted-peers record or raise ``RecordError``."""
    return _parse(AdmittedRecord, raw)


def pick_recent_hashes(history: Sequence[tuple[int, str]]) -> tuple[tuple[int, str], ...]:
    """The ``recent_hashes`` of a record from a node's last steps (``history``: (iteration, hash) in
    step order, up to ``HASH_HISTORY_STEPS`` of them): the last ``RECENT_STEPS`` steps, then the latest
    iterations that are multiples of ``HASH_ANCHOR_STRIDE``, then the latest others, ``MAX_RECENT_HASHES`` in all.

    Two replicas stepping in lock-step whose latest iterations differ by at most 64 (records published
    at different moments) then share at least one iteration: the latest multiple of 8 of the one behind
    (at most 7 back) is among the multiples of 8 the one ahead keeps (up to 71 back).
    """
    steps = sorted((i, h) for i, h in dict(history).items() if h)[-HASH_HISTORY_STEPS:]
    chosen = {i for i, _ in steps[-RECENT_STEPS:]}
    older = [i for i, _ in reversed(steps[:-RECENT_STEPS])]
    for iteration in [i for i in older if i % HASH_ANCHOR_STRIDE == 0] + [i for i in older if i % HASH_ANCHOR_STRIDE]:
        if len(chosen) >= MAX_RECENT_HASHES:
            break
        chosen.add(iteration)
    return tuple((i, h) for i, h in steps if i in chosen)


RecordT = TypeVar("RecordT", RunSpecRecord, NodeRecord, AdmittedRecord)


def encode_record(record: RunSpecRecord | NodeRecord | AdmittedRecord) -> bytes:
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
