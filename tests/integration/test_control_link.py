"""The control connection to p2pd (``gwtfp2p.transport.control_link``) between two real transports.

hivemind's reader of that connection dies when an answer comes for a call whose future was
cancelled a moment before (seen in a chaos run: a relay neither reached nor was reached by anyone
for the rest of the run, while its DHT still announced it). Our calls never cancel hivemind's
future, and a broken connection is reopened with the handlers registered again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gwtfp2p.transport import PeerTimeout, Transport
from tests.integration.conftest import run_async
from tests.integration.test_transport import Recorder

pytestmark = pytest.mark.timeout(90)


class SlowFlows(Recorder):
    """Flow messages named in ``gates`` are answered only once their event is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[bytes, asyncio.Event] = {}
        self.received: list[bytes] = []

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        self.received.append(payload)
        gate = self.gates.get(payload)
        if gate is not None:
            await gate.wait()


def control(transport: Transport) -> Any:
    return transport.p2p._client.control


async def pair() -> tuple[Transport, Transport, SlowFlows]:
    slow = SlowFlows()
    b = await Transport.standalone(slow)
    a = await Transport.standalone(Recorder(), initial_peers=await b.visible_maddrs())
    await a.ping(b.peer_id, timeout_s=10.0)
    return a, b, slow


async def until(condition, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


def test_a_caller_that_stops_waiting_leaves_the_call_to_finish():
    async def scenario():
        a, b, slow = await pair()
        try:
            slow.gates[b"slow"] = asyncio.Event()
            with pytest.raises(PeerTimeout):
                await a.send_flow(b.peer_id, b"slow", timeout_s=0.3)
            waiting = [f for f in control(a)._pending_calls.values() if not f.done()]
            assert len(waiting) == 1 and not waiting[0].cancelled()  # hivemind's future: still waiting
            slow.gates[b"slow"].set()
            await until(lambda: not any(not f.done() for f in control(a)._pending_calls.values()), 10.0)
            assert a.control_link.broken() is None
            await a.send_flow(b.peer_id, b"after", timeout_s=10.0)
        finally:
            await a.close()
            await b.close()

    run_async(scenario())


def test_a_broken_control_connection_is_reopened_and_waiting_calls_sent_again():
    async def scenario():
        a, b, slow = await pair()
        first = second = None
        try:
            slow.gates[b"first"], slow.gates[b"second"] = asyncio.Event(), asyncio.Event()
            first = asyncio.create_task(a.send_flow(b.peer_id, b"first", timeout_s=3.0))
            await until(lambda: b"first" in slow.received, 10.0)
            second = asyncio.create_task(a.send_flow(b.peer_id, b"second", timeout_s=20.0))
            await until(lambda: b"second" in slow.received, 10.0)
            calls = control(a)._pending_calls
            first_id = next(k for k, f in calls.items() if not f.done())  # the oldest waiting call
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            calls[first_id] = cancelled  # the window: its answer comes for a cancelled future
            slow.gates[b"first"].set()
            await until(lambda: a.control_link.reopened == 1, 10.0)
            assert a.control_link.broken() is None
            slow.gates[b"second"].set()
            await second  # answered on the new connection (sent again: b received it twice)
            assert slow.received.count(b"second") == 2
            with pytest.raises(PeerTimeout):
                await first  # its future was the cancelled one's: lost, its own deadline ends it
            await a.ping(b.peer_id, timeout_s=10.0)
            await b.ping(a.peer_id, timeout_s=10.0)  # a's handlers are registered again
        finally:
            # a failed try leaves no task whose exception is logged later, inside another test
            tasks = [t for t in (first, second) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await a.close()
            await b.close()

    run_async(scenario())
