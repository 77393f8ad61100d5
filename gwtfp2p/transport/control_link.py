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

REGISTER_RETRY_S = 0.1  # p2pd frees a closed connection's handlers a moment after it notices the close


class ControlLinkError(RuntimeError):
    """The control connection could not be reopened (p2pd gone or refusing)."""


class ControlLinkReset(P2PDaemonError):
    """A call that waited on a control connection that was then reopened: it may be sent again."""


class ControlLink:
    """Health of one ``P2P`` handle's persistent control connection; ``reopen`` repairs it."""

    def __init__(self, p2p: P2P) -> None:
        self._control: Any = p2p._client.control  # hivemind keeps it private; only this module reaches in
        self._unregistered: dict[str, Any] = {}  # handlers of a reopened connection p2pd has not taken yet
        self.reopened = 0

    def broken(self) -> str | None:
        """Why the connection is unusable (a task of it has ended, or p2pd has not taken our handlers on
        the reopened one), or None while it works."""
        reason = self._connection_broken()
        if reason is None and self._unregistered:
            return f"the handlers {sorted(self._unregistered)} are not registered on p2pd again"
        return reason

    def _connection_broken(self) -> str | None:
        for role, name in (("reader", "_read_task"), ("writer", "_write_task")):
            task: asyncio.Task | None = getattr(self._control, name, None)
            if task is None:
                return f"no {role} task"
            if task.done():
                error = "cancelled" if task.cancelled() else repr(task.exception())
                return f"its {role} task ended ({error})"
        return None

    async def repair(self, timeout_s: float) -> None:
        """Reopen a broken connection; on a working one, register what p2pd refused last time."""
        if self._connection_broken() is not None:
            await self.reopen(timeout_s)
            return
        await self._register_all(timeout_s)
        self.reopened += 1

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
        self._unregistered.update(control.unary_handlers)
        await self._register_all(timeout_s)
        self.reopened += 1

    async def _register_all(self, timeout_s: float) -> None:
        """Register every handler p2pd has not taken yet; one it still refuses at ``timeout_s`` stays
        listed (``broken`` says so, and the watch tries again)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for proto, handler in sorted(self._unregistered.items()):
            await self._register_again(proto, handler, deadline)
            del self._unregistered[proto]

    async def _register_again(self, proto: str, handler: Any, deadline: float) -> None:
        """p2pd keeps a handler of a closed connection until it notices the close: remove it, then add it on
        the new connection, again every ``REGISTER_RETRY_S`` while p2pd answers that it is still set."""
        control, loop = self._control, asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(control.remove_unary_handler(proto), max(deadline - loop.time(), 0.0))
            except P2PDaemonError:  # p2pd had dropped it already, or it is not ours to remove
                control.unary_handlers.pop(proto, None)
            except (asyncio.TimeoutError, OSError) as e:
                raise ControlLinkError(f"removing the stale handler {proto} from p2pd failed: {e!r}") from e
            try:
                await asyncio.wait_for(control.add_unary_handler(proto, handler), max(deadline - loop.time(), 0.0))
                return
            except P2PDaemonError as e:
                if loop.time() + REGISTER_RETRY_S >= deadline:
                    raise ControlLinkError(f"registering the handler {proto} again on p2pd failed: {e!r}") from e
            except (asyncio.TimeoutError, OSError) as e:
                raise ControlLinkError(f"registering the handler {proto} again on p2pd failed: {e!r}") from e
            await asyncio.sleep(REGISTER_RETRY_S)


async def watch_control_link(link: ControlLink, check_every_s: float, timeout_s: float) -> None:
    """Check the connection every ``check_every_s`` and repair it when broken (runs until cancelled)."""
    while True:
        await asyncio.sleep(check_every_s)
        reason = link.broken()
        if reason is None:
            continue
        logger.error("the control connection to p2pd is broken: %s; reopening it", reason)
        try:
            await link.repair(timeout_s)
        except ControlLinkError as e:
            logger.error("%s; retrying in %.1f s", e, check_every_s)
            continue
        logger.warning("control connection to p2pd reopened (%d time(s) so far)", link.reopened)
