"""Where a joiner's membership answers land: the inbox drops each ``MemberAnswer`` here while the
joiner waits for them (one handshake at a time)."""

from __future__ import annotations

import asyncio

from gwtfp2p.daemon.wire import MemberAnswer


class AnswerBox:
    """Where the inbox drops ``MemberAnswer``s while a joiner waits for them (one handshake at a time)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[MemberAnswer]] = {}
        self._stage = -1

    def expect(self, stage: int, peers: list[str]) -> dict[str, asyncio.Future[MemberAnswer]]:
        loop = asyncio.get_running_loop()
        self._stage, self._waiting = stage, {p: loop.create_future() for p in peers}
        return self._waiting

    def on_answer(self, sender: str, answer: MemberAnswer) -> None:
        future = self._waiting.get(sender)
        if future is not None and not future.done() and answer.stage == self._stage:
            future.set_result(answer)

    def clear(self) -> None:
        self._waiting = {}
