"""A joiner's membership handshake: its ``Member`` notice to every same-part peer, and their answers.

A peer answers *accepted*, or *stale* if it already aggregated that iteration, with its own iteration
(``MemberAnswer``). One that took the notice without answering in time (busy, or its guard had not read
the joiner's record yet and dropped the notice) is notified again, ``ROUNDS`` notices in all: a replica
that takes the joiner as a member unseen waits for it while the joiner steps without it (a stage split).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.wire import Member, MemberAnswer, encode_control
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)
ROUNDS = 3  # notices to a peer that takes them without answering, in all


class ControlSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class Answers:
    """What the peers said: ``accepted`` (sorted ids), ``stale`` (one already aggregated the iteration)
    and the most advanced iteration any of them named (``receiver_iteration``)."""

    accepted: list[str]
    stale: bool
    receiver_iteration: int


async def handshake(transport: ControlSender, box: AnswerBox, peers: list[str], stage: int, from_iteration: int,
                    timeout_s: float) -> Answers:
    """Our membership of ``stage`` from ``from_iteration`` to ``peers``, until each answered (or
    ``ROUNDS`` notices) or one answered *stale*."""
    answers: dict[str, MemberAnswer] = {}
    asking = list(peers)
    for _ in range(ROUNDS):
        got, took = await _notify(transport, box, asking, stage, from_iteration, timeout_s)
        answers.update(got)
        asking = [p for p in took if p not in got]
        if not asking or not all(a.accepted for a in got.values()):
            break
    else:
        logger.warning("stage %d: no membership answer from %s after %d notices", stage, asking, ROUNDS)
    return Answers(accepted=sorted(p for p, a in answers.items() if a.accepted),
                   stale=not all(a.accepted for a in answers.values()),
                   receiver_iteration=max((a.receiver_iteration for a in answers.values()), default=from_iteration))


async def _notify(transport: ControlSender, box: AnswerBox, peers: list[str], stage: int, from_iteration: int,
                  timeout_s: float) -> tuple[dict[str, MemberAnswer], list[str]]:
    """One round of notices: (the answers that came within ``timeout_s``, the peers that took the notice)."""
    futures = box.expect(stage, from_iteration, peers)
    payload = encode_control(Member(stage=stage, from_iteration=from_iteration))
    took = []
    for peer in peers:
        try:
            await transport.send_flow(peer, payload, timeout_s=timeout_s)
            took.append(peer)
        except TransportError as e:
            logger.debug("membership notice to %s lost: %s", peer, e)
            futures[peer].cancel()
    pending = {futures[p] for p in took}
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pending:  # until all answered, or one answered stale: that decides it (waiting on a silent peer
        # meanwhile would make the iteration it named stale by seconds, and any reservation from it too)
        done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - asyncio.get_running_loop().time()),
                                           return_when=asyncio.FIRST_COMPLETED)
        if not done or any(not f.cancelled() and not f.result().accepted for f in done):
            break
    got = {p: f.result() for p, f in futures.items() if f.done() and not f.cancelled()}
    box.clear()
    return got, took


async def withdraw(transport: ControlSender, peers: Iterable[str], stage: int, iteration: int,
                   timeout_s: float) -> None:
    """Tell ``peers`` that took our membership from ``iteration`` that we will not be there after all."""
    payload = encode_control(Member(stage=stage, from_iteration=iteration, until_iteration=iteration - 1))
    for peer in peers:
        try:
            await transport.send_flow(peer, payload, timeout_s=timeout_s)
        except TransportError as e:
            logger.debug("membership withdrawal to %s lost: %s", peer, e)
