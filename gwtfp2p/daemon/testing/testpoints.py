"""Test tooling beside ``crashpoints``: a delay at a named point, and arming a crash point at run time.

Off by default; no CLI flag arms either. ``$GWTF_DELAY_AT=POINT:SECONDS`` delays the first hit of
``POINT`` (after a ``delay`` event): ``serve_state`` (a replica about to serve its state to a
joining node; tests kill the joiner meanwhile); ``lag_join:N`` holds a joiner's first handshake
until its stage is N steps past the state it loaded (tests of the step replay); ``leave`` holds a
leaving node after its announcement (a stop that overruns: ``lifecycle/shutdown_watch.py``).
``$GWTF_CRASH_FILE=PATH``: on SIGUSR1 the daemon reads ``POINT:STAGE:ITERATION`` from PATH and
arms that crash point (``crashpoints.ARMED``); the chaos harness (``gwtf demo --churn``) picks
its victims and their moments this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.testing import crashpoints

logger = logging.getLogger(__name__)
DELAY_ENV = "GWTF_DELAY_AT"
CRASH_FILE_ENV = "GWTF_CRASH_FILE"
DELAY_POINTS = ("serve_state", "lag_join", "leave")


def parse_delay(text: str) -> tuple[str, float] | None:
    if not text.strip():
        return None
    point, _, seconds = text.strip().partition(":")
    try:
        delay_s = float(seconds)
    except ValueError:
        raise ValueError(f"${DELAY_ENV}: use POINT:SECONDS, got {text!r}") from None
    if point not in DELAY_POINTS or delay_s < 0:
        raise ValueError(f"${DELAY_ENV}: the point is one of {', '.join(DELAY_POINTS)}, seconds >= 0")
    return point, delay_s


_DELAY: tuple[str, float] | None = None  # from $GWTF_DELAY_AT, read when the node starts (``install``)


async def delay(point: str, events: Events | None) -> None:
    """Sleep here the first time if ``$GWTF_DELAY_AT`` names this point (no-op otherwise)."""
    global _DELAY
    if _DELAY is None or _DELAY[0] != point:
        return
    seconds, _DELAY = _DELAY[1], None
    if events is not None:
        events.emit("delay", point=point, seconds=seconds)
    await asyncio.sleep(seconds)


def take(point: str) -> float | None:
    """The value ``$GWTF_DELAY_AT`` gives this point, once (None otherwise): for waits counted in
    something other than seconds (``lag_join``: iterations, see ``aggregation/joining.py``)."""
    global _DELAY
    if _DELAY is None or _DELAY[0] != point:
        return None
    value, _DELAY = _DELAY[1], None
    return value


def arm_crash_from(path: str) -> None:
    """Arm the crash point written in ``path`` (``POINT:STAGE:ITERATION``; empty disarms)."""
    try:
        text = Path(path).read_text().strip()
        crashpoints.ARMED = crashpoints.Fault.parse(text) if text else None
    except (OSError, ValueError) as e:
        logger.error("crash point from %s not armed: %s", path, e)
        return
    logger.warning("test fault armed at run time: %s", text or "(none)")


def install() -> None:
    """Read the test points the environment arms (``$GWTF_CRASH_AT``, ``$GWTF_DELAY_AT``) and, with
    ``$GWTF_CRASH_FILE``, re-arm a crash point on every SIGUSR1. Nothing is armed otherwise."""
    global _DELAY
    crashpoints.arm_from_environment()
    _DELAY = parse_delay(os.environ.get(DELAY_ENV, ""))
    _install_crash_rearm()


def _install_crash_rearm() -> None:
    """If ``$GWTF_CRASH_FILE`` is set, arm its crash point on every SIGUSR1."""
    path = os.environ.get(CRASH_FILE_ENV, "")
    if path:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, arm_crash_from, path)
