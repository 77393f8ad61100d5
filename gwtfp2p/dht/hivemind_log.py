"""Routes hivemind's logging through the root logger at a level of our choosing.

hivemind installs its own handler and logs routine churn (unreachable peers, failed pings) as
ERROR with tracebacks. After ``route_hivemind_logs()`` its records propagate to the root logger
(our handler) and the ``hivemind`` logger only lets through records at or above ``level``.
"""

from __future__ import annotations

import logging
import os

from hivemind.utils.logging import use_hivemind_log_handler

DEFAULT_LEVEL_ENV = "GWTF_HIVEMIND_LOG_LEVEL"
_routed = False


def route_hivemind_logs(level: int | str | None = None) -> None:
    """Send hivemind's logs to the root logger; ``level`` defaults to $GWTF_HIVEMIND_LOG_LEVEL or CRITICAL.

    Idempotent; a later call with an explicit ``level`` changes the level. The forked DHT process
    inherits the setting when it is made before the DHT starts (``SwarmDHT.create`` calls this).
    """
    global _routed
    if _routed and level is None:
        return
    use_hivemind_log_handler("nowhere")
    if level is None:
        level = os.environ.get(DEFAULT_LEVEL_ENV, "CRITICAL").upper()
    logging.getLogger("hivemind").setLevel(level)
    _routed = True
