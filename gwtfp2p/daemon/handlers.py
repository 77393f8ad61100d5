"""The node's ``TransportHandlers``: every RPC that arrives is validated and routed, never computed.

Forward/backward transfers go to the data plane (a relay's ``RelayDataPath`` or a data holder's
``DataHolder``), aggregation contributions (forward RPCs tagged ``kind=grad``) to the
``Aggregator``, flow messages to the ``FlowDriver``, control messages to their owners and
data-plane recovery messages (``recovery_wire``) to the data path; a state download (or the
replay of the last steps, ``steplog.py``) is served between aggregation steps. Until the node is
up, transfers are refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from gwtfp2p.daemon import testpoints
from gwtfp2p.daemon.aggregation import GRAD_KIND
from gwtfp2p.daemon.control import Closed, ControlError, Member, MemberAnswer, decode_payload, encode_control
from gwtfp2p.daemon.recovery_wire import RecoveryWireError, decode_recovery, is_recovery
from gwtfp2p.transport import Ack, StateBlob, TransferMeta, TransportError

if TYPE_CHECKING:
    from gwtfp2p.daemon.node import Node

logger = logging.getLogger(__name__)
STATE_WAIT_S = 8.0


class NodeHandlers:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        node = self.node
        if meta.tags.get("kind") == GRAD_KIND:
            if node.aggregator is None:
                return Ack(accepted=False, reason="not aggregating yet")
            return await node.aggregator.on_contribution(sender, meta, tensor)
        if node.data is None:
            return Ack(accepted=False, reason="starting up")
        return await node.data.on_forward(sender, meta, tensor)

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        if self.node.data is None:
            return Ack(accepted=False, reason="starting up")
        return await self.node.data.on_backward(sender, meta, tensor)

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        if is_recovery(payload):
            self._on_recovery(sender, payload)
            return
        try:
            decoded = decode_payload(payload)
        except ControlError as e:
            logger.debug("bad payload from %s: %s", sender, e)
            return
        node = self.node
        if isinstance(decoded, list):
            if node.routing is not None:
                if not node.routing.knows(sender) and node.view is not None:
                    node.view.poke()
                node.routing.on_messages(sender, decoded)
        elif isinstance(decoded, Member):
            node.background.spawn(self._on_member(sender, decoded), f"member {sender}")
        elif isinstance(decoded, MemberAnswer):
            if node.joiner is not None:
                node.joiner.on_answer(sender, decoded)
        elif isinstance(decoded, Closed):
            await node.on_closed(decoded)

    def _on_recovery(self, sender: str, payload: bytes) -> None:
        try:
            message = decode_recovery(payload)
        except RecoveryWireError as e:
            logger.debug("bad recovery message from %s: %s", sender, e)
            return
        node = self.node
        if node.data is not None:
            node.background.spawn(node.data.on_recovery(sender, message), f"recovery message from {sender}")

    async def _on_member(self, sender: str, member: Member) -> None:
        node = self.node
        aggregator = node.aggregator
        if member.stage != node.stage or aggregator is None:
            return
        stale = member.from_iteration <= aggregator.done_through  # we already stepped that iteration
        known = node.members.get(sender)
        if member.until_iteration is not None and known is not None:
            node.members.set_until(sender, member.until_iteration)
            accepted = True
        elif stale and (known is None or known.from_iteration != member.from_iteration):
            accepted = False
        else:
            node.members.add(sender, member.from_iteration, member.until_iteration)
            accepted = True
        answer = MemberAnswer(stage=node.stage, from_iteration=member.from_iteration, accepted=accepted,
                              receiver_iteration=node.gate.iteration)
        try:
            await node.transport.send_flow(sender, encode_control(answer), timeout_s=5.0)
        except TransportError as e:
            logger.debug("membership answer to %s lost: %s", sender, e)

    async def get_state(self, stage: int) -> StateBlob | None:
        node = self.node
        if stage != node.stage or node.part is None or node.aggregator is None:
            return None
        await testpoints.delay("serve_state", node.events)  # tests only ($GWTF_DELAY_AT)
        if not await node.gate.wait_idle(STATE_WAIT_S):
            return None
        iteration, data = await node.compute.run(node.aggregator.state)
        return StateBlob(stage=stage, iteration=iteration, data=data)

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        """The steps this replica took since ``since_iteration`` (None: not all kept, or not our part)."""
        node = self.node
        if stage != node.stage or node.part is None or node.aggregator is None:
            return None
        # No wait for the step: the log and our iteration change together on the compute thread, and a
        # joiner that reserved the iteration we are aggregating needs the steps before it right now.
        replay = await node.compute.run(node.aggregator.steps_since, since_iteration)
        return None if replay is None else StateBlob(stage=stage, iteration=replay[0], data=replay[1])
