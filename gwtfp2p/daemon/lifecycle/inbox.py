"""The node's ``TransportHandlers``: every RPC that arrives is decoded and routed, never computed here.

Forward/backward transfers go to the data path (a relay's ``RelayPath`` or a data holder's
``HolderPath``), aggregation messages (forwards tagged ``kind=grad``) to the ``Aggregator``, flow
messages to the ``FlowDriver``, control messages to their owners (membership, the iteration's
``Closing``, a joiner's ``AnswerBox``, ``GlobalClip``'s norms, ``LostWork``'s redo requests and the
tensors they bring, tagged ``redo``), recovery messages to the ``Recovery``,
state and step downloads to the ``StateServer``. While the node starts up only membership answers are taken;
transfers are refused ("starting up"), as are transfers in another wire codec than the run's (with the
reason). Malformed payloads are dropped with a log line. Before routing, the ``Guard`` (``guard``) checks
who may send what and whether it is well-formed; messages that claim a peer died wait for our own probe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.aggregation.admission import silent_for
from gwtfp2p.daemon.aggregation.aggregator import Aggregator
from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.aggregation.membership import Membership
from gwtfp2p.daemon.aggregation.state import StateServer
from gwtfp2p.daemon.datapath.clipping import GlobalClip
from gwtfp2p.daemon.datapath.crosscheck import CrossCheck, is_check
from gwtfp2p.daemon.datapath.iterations import Closing
from gwtfp2p.daemon.datapath.recovery import Recovery
from gwtfp2p.daemon.datapath.redo import LostWork, is_redo
from gwtfp2p.daemon.lifecycle.guard import Guard
from gwtfp2p.daemon.swarm.routing import FlowDriver
from gwtfp2p.daemon.swarm.sending import codec_mismatch
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import misbehave
from gwtfp2p.daemon.wire import (
    STARTING_UP,
    Closed,
    Held,
    Lost,
    Member,
    MemberAnswer,
    PartNorm,
    Rebuild,
    Redo,
    Redone,
    StepNorm,
    Where,
    WireError,
    decode_payload,
    is_aggregation,
)
from gwtfp2p.transport import Ack, StateBlob, TransferMeta
from gwtfp2p.transport.compression import WireCodecs

logger = logging.getLogger(__name__)


class DataReceiver(Protocol):
    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack: ...
    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack: ...


@dataclass(frozen=True)
class Receivers:
    """Who takes each kind of message once the node serves."""

    data: DataReceiver
    aggregator: Aggregator
    routing: FlowDriver
    view: SwarmView
    membership: Membership
    closing: Closing
    recovery: Recovery
    state: StateServer
    clip: GlobalClip | None  # None: no norms are exchanged (per-part clipping)
    guard: Guard | None = None  # None: every message is routed as it comes (tests)
    checker: CrossCheck | None = None  # the two-replica output checks (None: not answered)
    redo: LostWork | None = None  # lost contributions redone (None: redo requests not answered)


class Inbox:
    """Routes incoming RPCs: to ``answers`` while starting up, to ``Receivers`` once ``serve`` is called."""

    def __init__(self, answers: AnswerBox, codecs: WireCodecs) -> None:
        self.answers = answers
        self.codecs = codecs
        self.background = Background("inbox")
        self._serving: Receivers | None = None

    def serve(self, receivers: Receivers) -> None:
        """The node is built: from now on every message goes to its receiver."""
        self._serving = receivers

    def _mismatch(self, kind: str, sender: str, meta: TransferMeta) -> str:
        """Why a transfer in another wire codec than the run's is refused ("" if it is the run's)."""
        mismatch = codec_mismatch(self.codecs, kind, meta)
        if mismatch:
            logger.warning("%s of %s from %s refused: %s", kind, meta.microbatch.key, sender, mismatch)
        return mismatch

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        serving = self._serving
        if serving is None:
            return Ack(accepted=False, reason=STARTING_UP)
        if mismatch := self._mismatch("forward", sender, meta):
            return Ack(accepted=False, reason=mismatch)
        guard = serving.guard
        if is_redo(meta) and serving.redo is not None:
            return serving.redo.on_tensor(sender, "forward", meta, tensor)
        if is_aggregation(meta):
            if guard is not None and (claimed := guard.claimed_dead(meta)) is not None:
                aggregator, t = serving.aggregator, meta.microbatch.iteration
                self.background.spawn(self._claim(guard, sender, claimed, "agreement query",
                                                  aggregator.on_contribution(sender, meta, tensor),
                                                  lambda p: silent_for(aggregator.round_of(t), p, aggregator.clock()),
                                                  aggregator.on_contribution(sender, meta, tensor, confirmed=False)),
                                      f"query from {sender}")
                return Ack()
            return await serving.aggregator.on_contribution(sender, meta, tensor)
        if guard is not None and (refusal := guard.forward(sender, meta, tensor)) is not None:
            return refusal
        if is_check(meta) and serving.checker is not None:
            return serving.checker.on_request(sender, meta, tensor)
        if misbehave.armed("swallow"):  # tests only: a volunteer that takes work and never does it
            return Ack()
        return await serving.data.on_forward(sender, meta, tensor)

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        serving = self._serving
        if serving is None:
            return Ack(accepted=False, reason=STARTING_UP)
        if mismatch := self._mismatch("backward", sender, meta):
            return Ack(accepted=False, reason=mismatch)
        if is_check(meta) and serving.checker is not None:
            return serving.checker.on_answer(sender, meta, tensor)
        if is_redo(meta) and serving.redo is not None:
            return serving.redo.on_tensor(sender, "backward", meta, tensor)
        if serving.guard is not None and (refusal := serving.guard.backward(sender, meta, tensor)) is not None:
            return refusal
        return await serving.data.on_backward(sender, meta, tensor)

    async def _claim(self, guard: Guard, sender: str, claimed: tuple[str, ...], what: str, deliver: Any,
                     silent_s: Any = lambda _peer: 0.0, unconfirmed: Any = None) -> None:
        """Deliver a message that claims peers died once our own evidence agrees (``Guard.claims_hold``);
        else only ``unconfirmed``, if given (both are coroutines: the one not run is closed)."""
        holds = await guard.claims_hold(sender, claimed, what, silent_s)
        run, drop = (deliver, unconfirmed) if holds else (unconfirmed, deliver)
        if drop is not None:
            drop.close()
        if run is not None:
            await run

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        try:
            decoded = decode_payload(payload)
        except WireError as e:
            logger.debug("bad payload from %s: %s", sender, e)
            return
        if isinstance(decoded, MemberAnswer):
            self.answers.on_answer(sender, decoded)
            return
        serving = self._serving
        if serving is None:
            return
        guard = serving.guard
        if isinstance(decoded, list):
            if not serving.routing.knows(sender):
                serving.view.poke()
            if guard is None or guard.knows(sender):
                serving.routing.on_messages(sender, decoded)
        elif isinstance(decoded, Member):
            self.background.spawn(self._member(serving, sender, decoded), f"member {sender}")
        elif isinstance(decoded, Closed):
            if guard is None or guard.closed(sender, decoded):
                await serving.closing.on_closed(decoded)
        elif isinstance(decoded, PartNorm) and serving.clip is not None:
            serving.clip.on_part_norm(sender, decoded)
        elif isinstance(decoded, StepNorm) and serving.clip is not None:
            serving.clip.on_step_norm(sender, decoded)
        elif isinstance(decoded, Redo) and serving.redo is not None:
            serving.redo.on_ask(sender, decoded)
        elif isinstance(decoded, Redone) and serving.redo is not None:
            serving.redo.on_done(sender, decoded)
        elif isinstance(decoded, Rebuild) and serving.redo is not None:
            serving.redo.on_rebuild(sender, decoded)
        elif isinstance(decoded, Lost) and guard is not None and not guard.knows(sender):  # a stranger's claim
            self.background.spawn(self._claim(guard, sender, (decoded.lost,), "Lost",
                                              serving.recovery.on_message(sender, decoded)), f"Lost from {sender}")
        elif isinstance(decoded, (Lost, Where, Held)):
            self.background.spawn(serving.recovery.on_message(sender, decoded), f"recovery message from {sender}")

    async def _member(self, serving: Receivers, sender: str, member: Member) -> None:
        await serving.membership.on_notice(sender, member, None if serving.guard is None else serving.guard.member)

    async def get_state(self, stage: int) -> StateBlob | None:
        serving = self._serving
        return None if serving is None else await serving.state.get_state(stage)

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        serving = self._serving
        return None if serving is None else await serving.state.get_steps(stage, since_iteration)

    async def close(self) -> None:
        await self.background.close()
