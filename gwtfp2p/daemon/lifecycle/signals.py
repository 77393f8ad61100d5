"""SIGINT/SIGTERM handling: the first signal asks for a graceful leave, a second exits at once.

The graceful path (announce leaving, stop taking flow, finish in-flight work up to the grace
period) is the node's; this module only turns signals into an ``asyncio.Event``. The hard exit
relies on the DHT child's parent-death signal (armed by ``SwarmDHT.create``) to take it along.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

logger = logging.getLogger(__name__)
HARD_EXIT_CODE = 130


def install_stop_signals(stop: asyncio.Event) -> None:
    """First SIGINT/SIGTERM sets ``stop``; the second one exits the process immediately."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(HARD_EXIT_CODE)
        logger.info("%s: leaving gracefully (send it again to exit at once)", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
