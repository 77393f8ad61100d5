"""Where a joiner's membership answers land: the inbox drops each ``MemberAnswer`` here while the
joiner waits for them (one handshake at a time). Only answers to the notice sent now are taken: an
answer names the notice's iterations, and one to an earlier notice (late, or to a withdrawal) arriving
during a later handshake would otherwise speak for it (a joiner took replicas' late *accepted* answers to
a withdrawn reservation for acceptance of the iteration they had just refused, and stepped alone).
"""

from __future__ import annotations

import asyncio

from gwtfp2p.daemon.wire import MemberAnswer


class AnswerBox:
    """Where the inbox drops ``MemberAnswer``s while a joiner waits for them (one handshake at a time)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[MemberAnswer]] = {}
        self._stage = -1
        self._from_iteration = -1

    def expect(self, stage: int, from_iteration: int, peers: list[str]) -> dict[str, asyncio.Future[MemberAnswer]]:
        """Wait for ``peers``' answers to our notice of membership of ``stage`` from ``from_iteration``."""
        loop = asyncio.get_running_loop()
        self._stage, self._from_iteration = stage, from_iteration
        self._waiting = {p: loop.create_future() for p in peers}
        return self._waiting

    def on_answer(self, sender: str, answer: MemberAnswer) -> None:
        future = self._waiting.get(sender)
        if future is None or future.done():
            return
        if (answer.stage, answer.from_iteration, answer.until_iteration) == (self._stage, self._from_iteration, None):
            future.set_result(answer)

    def clear(self) -> None:
        self._waiting = {}
