"""Routes hivemind's logging through the root logger at a level of our choosing.

hivemind installs its own handler and logs routine churn (unreachable peers, failed pings) as
ERROR with tracebacks. After ``route_hivemind_logs()`` its records propagate to the root logger
(our handler) and the ``hivemind`` logger only lets through records at or above ``level``.
``$GWTF_P2PD_LOG_LEVEL`` sets a level of its own for ``hivemind.p2p.p2p_daemon``, the logger that
relays each p2pd's own log lines (hivemind files p2pd's INFO and WARN lines at DEBUG): at DEBUG a
node's log shows what its p2pd refused or dropped.
"""

from __future__ import annotations

import logging
import os

from hivemind.utils.logging import use_hivemind_log_handler

DEFAULT_LEVEL_ENV = "GWTF_HIVEMIND_LOG_LEVEL"
P2PD_LEVEL_ENV = "GWTF_P2PD_LOG_LEVEL"
P2PD_LOGGER = "hivemind.p2p.p2p_daemon"
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
    logging.getLogger(P2PD_LOGGER).setLevel(p2pd_level())
    _routed = True


def p2pd_level() -> int:
    """The level ``$GWTF_P2PD_LOG_LEVEL`` names (NOTSET where unset: p2pd's lines take hivemind's level).

    Raises ``ValueError`` naming the variable and the levels it takes.
    """
    name = os.environ.get(P2PD_LEVEL_ENV, "").strip().upper()
    if not name:
        return logging.NOTSET
    levels = logging.getLevelNamesMapping()
    if name not in levels:
        raise ValueError(f"${P2PD_LEVEL_ENV}={name!r} is not a log level: set it to DEBUG, INFO, WARNING, "
                         "ERROR or CRITICAL, or unset it")
    return levels[name]
