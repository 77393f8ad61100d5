"""The node's persistent control connection to p2pd (hivemind's unary calls and handlers), kept alive.

hivemind carries every unary call and every incoming unary request over one socket to p2pd, read
and written by two tasks that end silently on the first error (e.g. an answer for a call whose
future was cancelled a moment before: ``InvalidStateError``). A node whose tasks ended can neither
reach nor be reached while its DHT, in another process, still announces it: a zombie. ``ControlLink``
notices that and reopens the connection, re-registering the handlers. Owns no RPC semantics.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hivemind.p2p import P2P, P2PDaemonError

logger = logging.getLogger(__name__)


class ControlLinkError(RuntimeError):
    """The control connection could not be reopened (p2pd gone or refusing)."""


class ControlLinkReset(P2PDaemonError):
    """A call that waited on a control connection that was then reopened: it may be sent again."""


class ControlLink:
    """Health of one ``P2P`` handle's persistent control connection; ``reopen`` repairs it."""

    def __init__(self, p2p: P2P) -> None:
        self._control: Any = p2p._client.control  # hivemind keeps it private; only this module reaches in
        self.reopened = 0

    def broken(self) -> str | None:
        """Why the connection is unusable (a task of it has ended), or None while it works."""
        for role, name in (("reader", "_read_task"), ("writer", "_write_task")):
            task: asyncio.Task | None = getattr(self._control, name, None)
            if task is None:
                return f"no {role} task"
            if task.done():
                error = "cancelled" if task.cancelled() else repr(task.exception())
                return f"its {role} task ended ({error})"
        return None

    async def reopen(self, timeout_s: float) -> None:
        """Open a new connection, then close the old one (p2pd drops the old one's handlers; a p2pd
        left with no connection at all would exit), fail the calls that were waiting on the old one
        and register the same unary handlers on the new one."""
        control = self._control
        old_tasks = [t for t in (control._read_task, control._write_task) if t is not None]
        old_calls = list(control._pending_calls.values())
        control._pending_messages = asyncio.Queue()  # the old writer stays parked on the old queue
        try:
            await asyncio.wait_for(control._ensure_persistent_conn(), timeout_s)
        except (asyncio.TimeoutError, OSError) as e:
            raise ControlLinkError(f"opening a new control connection to p2pd failed: {e!r}") from e
        for task in old_tasks:
            task.cancel()  # the old writer closes the old socket on its way out
        await asyncio.gather(*old_tasks, return_exceptions=True)
        lost = ControlLinkReset("the control connection to p2pd was lost and reopened; retry the call")
        for future in old_calls:
            if not future.done():
                future.set_exception(lost)
        for task in list(control._handler_tasks.values()):
            task.cancel()
        control._handler_tasks.clear()
        for proto, handler in list(control.unary_handlers.items()):
            await self._register_again(proto, handler, timeout_s)
        self.reopened += 1

    async def _register_again(self, proto: str, handler: Any, timeout_s: float) -> None:
        """p2pd keeps a handler of a closed connection: remove it, then add it on the new connection."""
        control = self._control
        try:
            await asyncio.wait_for(control.remove_unary_handler(proto), timeout_s)
        except P2PDaemonError:  # p2pd had dropped it already
            control.unary_handlers.pop(proto, None)
        except (asyncio.TimeoutError, OSError) as e:
            raise ControlLinkError(f"removing the stale handler {proto} from p2pd failed: {e!r}") from e
        try:
            await asyncio.wait_for(control.add_unary_handler(proto, handler), timeout_s)
        except (asyncio.TimeoutError, OSError, P2PDaemonError) as e:
            control.unary_handlers.setdefault(proto, handler)
            raise ControlLinkError(f"registering the handler {proto} again on p2pd failed: {e!r}") from e


async def watch_control_link(link: ControlLink, check_every_s: float, timeout_s: float) -> None:
    """Check the connection every ``check_every_s`` and reopen it when broken (runs until cancelled)."""
    while True:
        await asyncio.sleep(check_every_s)
        reason = link.broken()
        if reason is None:
            continue
        logger.error("the control connection to p2pd is broken: %s; reopening it", reason)
        try:
            await link.reopen(timeout_s)
        except ControlLinkError as e:
            logger.error("%s; retrying in %.1f s", e, check_every_s)
            continue
        logger.warning("control connection to p2pd reopened (%d time(s) so far)", link.reopened)
