"""Every message daemons exchange besides the transport's own, and its codec (peers are untrusted).

On ``send_flow`` one payload is a tag byte and a body: ``F`` flow-protocol messages (one per line,
``gwtfp2p.flow.wire``); ``C`` one control message (``Member``: I aggregate with a stage from/until an
iteration; ``MemberAnswer``: accepted, or your state is stale; ``Closed``: the data holders closed an
iteration; ``PartNorm``/``StepNorm``: a part's squared gradient norm, the whole model's for the
step; ``Redo``/``Redone``: a lost contribution's inputs asked for and sent, ``datapath/redo.py``); ``R`` one
data-plane recovery message (``Lost``, ``Where``, ``Held``, docs/churn.md). Aggregation messages ride the
forward RPC tagged ``kind=grad`` (``AggMessage``); a replica's last steps travel as ``steps_wire`` bytes.
Every decoder raises ``WireError`` with the reason; none acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gwtfp2p.config import WIRE_CODECS
from gwtfp2p.flow.messages import Message
from gwtfp2p.flow.wire import WireError as FlowWireError
from gwtfp2p.flow.wire import decode_message, encode_message
from gwtfp2p.ids import PeerId
from gwtfp2p.transport import MicrobatchId, TransferMeta

FLOW_TAG, CONTROL_TAG, RECOVERY_TAG = b"F", b"C", b"R"
MAX_CONTROL_BYTES = 16 * 1024
MAX_RECOVERY_BYTES = 64 * 1024
MAX_MICROBATCHES, MAX_IDS = 256, 64
STARTING_UP = "starting up"  # the refusal of a node that does not serve yet: worth retrying

Iteration = Annotated[int, Field(ge=0, le=2**53)]
Stage = Annotated[int, Field(ge=0, le=1024)]
Microbatches = Annotated[tuple[MicrobatchId, ...], Field(max_length=MAX_MICROBATCHES)]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class WireError(ValueError):
    """A message that does not parse; the reason goes back to the sender or into the log."""


class Member(BaseModel):
    """The sender aggregates with ``stage`` from ``from_iteration`` to ``until_iteration`` (None: open)."""
    model_config = _STRICT
    kind: Literal["member"] = "member"
    stage: Stage
    from_iteration: Iteration
    until_iteration: Iteration | None = None


class MemberAnswer(BaseModel):
    """Answer to ``Member``: not ``accepted`` when the receiver already aggregated ``from_iteration``.
    ``from_iteration`` and ``until_iteration`` repeat the notice's, so an answer is never taken for
    another notice's (a late answer, or a withdrawal's)."""
    model_config = _STRICT
    kind: Literal["member_answer"] = "member_answer"
    stage: Stage
    from_iteration: Iteration
    accepted: bool
    receiver_iteration: Iteration
    until_iteration: Iteration | None = None


class Closed(BaseModel):
    """Every live data holder closed ``iteration`` and stepped; the swarm's figures for it."""
    model_config = _STRICT
    kind: Literal["closed"] = "closed"
    iteration: Iteration
    data_holders: Annotated[tuple[PeerId, ...], Field(max_length=256)]
    loss: Annotated[float, Field(ge=-1e6, le=1e6)] | None = None
    microbatches: Annotated[int, Field(ge=0, le=10**9)] = 0
    tokens_per_s: Annotated[float, Field(ge=0.0, le=1e15)] = 0.0


SqNorm = Annotated[float, Field(ge=0.0, le=1e300)] | None  # None: not finite (the step is skipped)


class PartNorm(BaseModel):
    """A replica of ``stage`` reduced ``iteration``: its part's squared gradient norm, for the total."""
    model_config = _STRICT
    kind: Literal["part_norm"] = "part_norm"
    iteration: Iteration
    stage: Stage
    sq_norm: SqNorm


class StepNorm(BaseModel):
    """The data holders' total of every part's squared norm for ``iteration``: step with it."""
    model_config = _STRICT
    kind: Literal["step_norm"] = "step_norm"
    iteration: Iteration
    total_sq_norm: SqNorm


class Redo(BaseModel):
    """Send me what you kept of ``iteration`` for ``stage`` whose replica is none of ``members`` (those its step
    uses): the inputs you sent it whose gradient it returned, the gradients you sent it (tagged ``redo``). With
    ``microbatches``: what you kept of those, whichever replica did them (a part whose step lost nothing rebuilds
    a half for its neighbour's redo, ``redo_chain``)."""
    model_config = _STRICT
    kind: Literal["redo"] = "redo"
    iteration: Iteration
    stage: Stage
    members: Annotated[tuple[PeerId, ...], Field(max_length=MAX_IDS)]
    microbatches: Microbatches = ()


class Redone(BaseModel):
    """The answer to ``Redo``, after its tensors: how many inputs and gradients went."""
    model_config = _STRICT
    kind: Literal["redone"] = "redone"
    iteration: Iteration
    stage: Stage
    inputs: Annotated[int, Field(ge=0, le=10**6)]
    grads: Annotated[int, Field(ge=0, le=10**6)]


class Rebuild(BaseModel):
    """Rebuild the outputs of ``microbatches`` of ``iteration`` that you (a replica of ``stage`` - 1) feed my
    ``stage`` and push them up (``redo_chain``): the replica of yours that did them sent its sum and died, the
    one of mine they went to died with its sum unsent, so no live neighbour kept them."""
    model_config = _STRICT
    kind: Literal["rebuild"] = "rebuild"
    iteration: Iteration
    stage: Stage
    microbatches: Microbatches


Control = Member | MemberAnswer | Closed | PartNorm | StepNorm | Redo | Redone | Rebuild


class Lost(BaseModel):
    """The sender's gradient of ``microbatch`` could not reach its previous hop ``lost``: resend it
    elsewhere and route it to the sender to rejoin (sent to the nearest live hop upstream)."""
    model_config = _STRICT
    kind: Literal["lost"] = "lost"
    microbatch: MicrobatchId
    lost: PeerId
    stage: Stage  # the stage the sender serves (0: a data holder's tail)


class Where(BaseModel):
    """Which of these microbatches do you hold with ``lost`` on their recorded path?"""
    model_config = _STRICT
    kind: Literal["where"] = "where"
    microbatches: Microbatches
    lost: PeerId


class Held(BaseModel):
    """The answer to ``Where`` (possibly empty), with the stage the holder serves."""
    model_config = _STRICT
    kind: Literal["held"] = "held"
    microbatches: Microbatches
    lost: PeerId
    stage: Stage


Recovery = Lost | Where | Held
_CONTROL = TypeAdapter(Annotated[Control, Field(discriminator="kind")])
_RECOVERY = TypeAdapter(Annotated[Recovery, Field(discriminator="kind")])


def encode_flow(messages: list[Message]) -> bytes:
    return FLOW_TAG + b"\n".join(encode_message(m) for m in messages)


def encode_control(message: Control) -> bytes:
    return CONTROL_TAG + message.model_dump_json().encode()


def encode_recovery(message: Recovery) -> bytes:
    return RECOVERY_TAG + message.model_dump_json().encode()


def _validated(adapter: TypeAdapter, body: bytes, limit: int, what: str) -> Any:
    if len(body) > limit:
        raise WireError(f"{what} message of {len(body)} bytes exceeds {limit}")
    try:
        return adapter.validate_json(body)
    except ValidationError as e:
        raise WireError(f"bad {what} message: {e.errors()[0]['msg'] if e.errors() else e}") from None


def decode_payload(payload: bytes) -> list[Message] | Control | Recovery:
    """Flow messages (a list), one control or one recovery message; ``WireError`` on anything else."""
    tag, body = payload[:1], payload[1:]
    if tag == FLOW_TAG:
        try:
            return [decode_message(line) for line in body.split(b"\n") if line]
        except FlowWireError as e:
            raise WireError(f"bad flow message: {e}") from None
    if tag == CONTROL_TAG:
        return _validated(_CONTROL, body, MAX_CONTROL_BYTES, "control")
    if tag == RECOVERY_TAG:
        return _validated(_RECOVERY, body, MAX_RECOVERY_BYTES, "recovery")
    raise WireError(f"unknown payload tag {tag!r}")


GRAD_KIND = "grad"
CONTRIB, VIEW = "contrib", "view"
QUERY, REPORT, DECIDED, WANT = "query", "report", "decided", "want"  # the agreement's (aggregation/agreement.py)
AGG_OPS = (CONTRIB, VIEW, QUERY, REPORT, DECIDED, WANT)
PROTOCOL_TAGS = ("kind", "op", "count", "origin", "epoch", "bound", "codec")
EMPTY = torch.zeros(0)


@dataclass(frozen=True)
class AggMessage:
    """``contrib`` (a gradient sum, ``ids`` = the sender's expected members), ``view`` (those changed),
    or the agreement's ``query``/``report``/``decided``/``want`` (``ids`` = peer ids, ``epoch``)."""

    op: str
    iteration: int
    ids: tuple[str, ...]
    origin: str = ""  # contrib: whose contribution (the sender unless forwarded)
    count: int = 0
    bound: int = 0  # contrib: the bound of the fixed-point sum (``model.aggregate.GradContribution``)
    codec: str = "none"  # contrib: how the sum is encoded (``RunSpec.aggregate_codec``, aggregation/encoding.py)
    epoch: int = 0
    tags: dict[str, Any] | None = None  # contrib: the part's own tags (loss sums, tokens)


def is_aggregation(meta: TransferMeta) -> bool:
    return meta.tags.get("kind") == GRAD_KIND


def encode_aggregation(self_id: str, stage: int, message: AggMessage) -> TransferMeta:
    tags: dict[str, Any] = {"kind": GRAD_KIND, "op": message.op}
    if message.op == CONTRIB:
        tags.update(message.tags or {})
        tags["count"] = message.count
        tags["bound"], tags["codec"] = message.bound, message.codec
        if message.origin and message.origin != self_id:
            tags["origin"] = message.origin
    if message.op in (QUERY, REPORT):
        tags["epoch"] = message.epoch
    return TransferMeta(microbatch=MicrobatchId(data_holder=self_id, iteration=message.iteration, index=0),
                        stage=stage, path=tuple(message.ids)[:MAX_IDS], tags=tags)


def decode_aggregation(sender: str, meta: TransferMeta) -> AggMessage:
    """The message in ``meta``; ``WireError`` if malformed (its tensor: ``aggregation/encoding.py``)."""
    tags = meta.tags
    op = tags.get("op", CONTRIB)
    if op not in AGG_OPS:
        raise WireError(f"unknown aggregation op {op!r}")
    t = meta.microbatch.iteration
    if op != CONTRIB:
        epoch = tags.get("epoch", 0)
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < -1:
            raise WireError("bad epoch")
        return AggMessage(op, t, meta.path, epoch=epoch)
    count, bound, origin, codec = tags.get("count"), tags.get("bound", 0), tags.get("origin", sender), tags.get("codec")
    for name, value in (("count", count), ("bound", bound)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise WireError(f"a contribution needs an integer {name} >= 0")
    if not isinstance(origin, str) or not origin or codec not in WIRE_CODECS:
        raise WireError("bad origin or codec")
    own = {k: v for k, v in tags.items() if k not in PROTOCOL_TAGS}
    return AggMessage(CONTRIB, t, meta.path, origin=origin, count=count, bound=bound, codec=codec, tags=own)
