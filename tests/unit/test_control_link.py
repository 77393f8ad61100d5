"""ControlLink (transport/control_link.py) against a fake p2pd control client: a reopened connection's
handlers are registered again even while p2pd still holds the closed connection's ones for a moment, and
a handler p2pd keeps refusing is reported by ``broken`` until a later repair registers it.

The CI run at 3db0afc failed its first try of test_control_link.py's reopen scenario: p2pd answered
"handler ... already set" to the re-registration, the link gave up, and since the new connection itself
worked the watch never tried again (the node could call out but was not reachable)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hivemind.p2p import P2PDaemonError

from gwtfp2p.transport.control_link import ControlLink, ControlLinkError


class FakeControl:
    """hivemind's ControlClient as far as ControlLink uses it; p2pd holds the old connection's handler
    for ``held_for`` more add attempts after the reopen."""

    def __init__(self, held_for: int) -> None:
        self.unary_handlers = {"proto/flow": object()}
        self.p2pd_handlers = set(self.unary_handlers)  # what p2pd has registered (the old connection's)
        self.held_for = held_for
        self.adds = 0
        self._read_task = self._write_task = None
        self._pending_calls: dict = {}
        self._pending_messages: asyncio.Queue = asyncio.Queue()
        self._handler_tasks: dict = {}

    async def _ensure_persistent_conn(self) -> None:
        forever = asyncio.get_running_loop().create_future()
        self._read_task = asyncio.ensure_future(forever)
        self._write_task = asyncio.ensure_future(asyncio.shield(forever))

    async def remove_unary_handler(self, proto: str) -> None:
        if proto not in self.unary_handlers:
            raise P2PDaemonError(f"Handler for protocol {proto} is not registered")
        raise P2PDaemonError("handler of another connection")  # p2pd: not ours to remove

    async def add_unary_handler(self, proto: str, handler: object) -> None:
        if proto in self.unary_handlers:
            raise P2PDaemonError(f"Handler for protocol {proto} already registered")
        self.unary_handlers[proto] = handler
        self.adds += 1
        if self.adds <= self.held_for:
            raise P2PDaemonError(f"handler for protocol {proto} already set")
        self.p2pd_handlers.add(proto)


def link_with(control: FakeControl) -> ControlLink:
    return ControlLink(SimpleNamespace(_client=SimpleNamespace(control=control)))


async def broken_link(held_for: int) -> tuple[ControlLink, FakeControl]:
    control = FakeControl(held_for)
    dead = asyncio.get_running_loop().create_future()
    dead.set_exception(asyncio.InvalidStateError("invalid state"))
    control._read_task = asyncio.ensure_future(dead)
    control._write_task = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)
    return link_with(control), control


def test_a_handler_p2pd_still_holds_for_a_moment_is_registered_once_it_lets_go() -> None:
    async def scenario() -> None:
        link, control = await broken_link(held_for=3)
        assert link.broken() is not None
        await link.reopen(timeout_s=5.0)
        assert link.broken() is None and link.reopened == 1
        assert control.adds == 4 and "proto/flow" in control.unary_handlers

    asyncio.run(scenario())


def test_a_handler_p2pd_keeps_refusing_is_reported_and_registered_by_a_later_repair() -> None:
    async def scenario() -> None:
        link, control = await broken_link(held_for=10**6)
        with pytest.raises(ControlLinkError, match="already set"):
            await link.repair(timeout_s=0.25)
        assert "not registered on p2pd again" in (link.broken() or "") and link.reopened == 0
        control.held_for = control.adds  # p2pd lets the old connection's handler go
        await link.repair(timeout_s=0.25)  # the connection works: only the handler is registered
        assert link.broken() is None and link.reopened == 1 and "proto/flow" in control.p2pd_handlers

    asyncio.run(scenario())
