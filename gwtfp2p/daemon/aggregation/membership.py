"""The membership protocol of one part: notices (``Member``) sent and answered, the table kept.

A node tells every same-part peer from which iteration it aggregates (when it joins, when a peer is
introduced, when it leaves: until which). A notice is accepted unless it names an iteration this
replica already aggregated or decided, for a membership it does not know (the sender's state is stale: it must
replay or download again); the answer says so and carries our iteration. A sender's notices are taken
in the order they came, each after the one before was vetted and answered: vetting may wait for the view
(a joiner's record), and an earlier notice taken after a later one would undo it (a joiner's refused
membership from t, taken after its reservation of t + 2, had a replica wait for it at t). Messages:
``wire.Member``, ``wire.MemberAnswer``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.wire import Member, MemberAnswer, encode_control
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)


class ControlSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


class Membership:
    """Sends this node's notices and answers the others' for one part (stage ``stage``)."""

    def __init__(self, stage: int, members: MemberTable, *, transport: ControlSender,
                 same_part_peers: Callable[[], list[str]], fixed_through: Callable[[], int],
                 iteration: Callable[[], int], timeout_s: float) -> None:
        self.stage = stage
        self.members = members
        self.transport = transport
        self.same_part_peers = same_part_peers  # every same-part peer of the view (online or joining)
        self.fixed_through = fixed_through  # the last iteration this replica aggregated or decided
        self.iteration = iteration
        self.timeout_s = timeout_s
        self._order: dict[str, asyncio.Lock] = {}  # per sender with notices in hand: taken one at a time
        self._in_hand: dict[str, int] = {}

    async def send_member(self, peer: str) -> None:
        own = self.members.own
        message = Member(stage=self.stage, from_iteration=own.from_iteration, until_iteration=own.until_iteration)
        await self._send(peer, encode_control(message), "membership notice")

    async def announce(self) -> None:
        """Tell every same-part peer in the view our membership (after a change)."""
        await asyncio.gather(*(self.send_member(p) for p in self.same_part_peers()))

    def accepts(self, sender: str, member: Member) -> bool:
        """Record ``sender``'s notice unless its state is stale; whether it was accepted."""
        stale = member.from_iteration <= self.fixed_through()  # we already decided that iteration
        known = self.members.get(sender)
        if member.until_iteration is not None and known is not None:
            self.members.set_until(sender, member.until_iteration)
            return True
        if stale and (known is None or known.from_iteration != member.from_iteration):
            return False
        self.members.add(sender, member.from_iteration, member.until_iteration)
        return True

    async def on_notice(self, sender: str, member: Member,
                        vet: Callable[[str, Member], Awaitable[bool]] | None = None) -> None:
        """A notice as it came: vetted (``vet``: whether it may be taken, None: every one is), then answered,
        after every earlier notice of ``sender``."""
        lock = self._order.setdefault(sender, asyncio.Lock())
        self._in_hand[sender] = self._in_hand.get(sender, 0) + 1
        try:
            async with lock:  # asyncio's lock wakes its waiters in the order they came
                if vet is None or await vet(sender, member):
                    await self.on_member(sender, member)
        finally:
            self._in_hand[sender] -= 1
            if not self._in_hand[sender]:
                del self._in_hand[sender], self._order[sender]

    async def on_member(self, sender: str, member: Member) -> None:
        if member.stage != self.stage:
            return
        answer = MemberAnswer(stage=self.stage, from_iteration=member.from_iteration,
                              accepted=self.accepts(sender, member), receiver_iteration=self.iteration(),
                              until_iteration=member.until_iteration)
        await self._send(sender, encode_control(answer), "membership answer")

    async def _send(self, peer: str, payload: bytes, what: str) -> None:
        try:
            await self.transport.send_flow(peer, payload, timeout_s=self.timeout_s)
        except TransportError as e:
            logger.debug("%s to %s lost: %s", what, peer, e)
