"""Test tooling: a crash at a named point of the data plane, armed only by ``$GWTF_CRASH_AT``.

Off by default. ``GWTF_CRASH_AT=POINT:STAGE:ITERATION`` makes the daemon serving ``STAGE`` crash the
first time it reaches ``POINT`` in an iteration ≥ ``ITERATION``: it emits a ``fault`` event, then
SIGKILLs its own process group (its DHT process and p2pd with it), exactly as a crash would.
Points: ``exit_after_forward`` (a relay computed a forward and has not sent it on),
``exit_before_backward`` (a gradient arrives at a relay, before it is acknowledged: the sender's
transfer fails; held until the relay's forwards of that iteration went on, so the next stage holds
them all), ``exit_after_sending`` (a data holder sent all microbatches of the iteration) and
``exit_before_aggregation`` (only in an iteration where the replica carried work: its contribution dies).
Used by ``tests/integration/test_churn_*.py`` to crash a node mid-forward/mid-backward
deterministically.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass

from gwtfp2p.daemon.events import Events

logger = logging.getLogger(__name__)
CRASH_ENV = "GWTF_CRASH_AT"
POINTS = ("exit_after_forward", "exit_before_backward", "exit_after_sending",
          "exit_mid_aggregation",  # aggregation/aggregator.py (our contribution reached one member)
          "exit_before_aggregation")  # datapath/iterations.py (the iteration closed: every backward done, none sent)


@dataclass(frozen=True)
class Fault:
    point: str
    stage: int
    iteration: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        try:
            point, stage, iteration = text.strip().split(":")
            fault = cls(point, int(stage), int(iteration))
        except ValueError:
            raise ValueError(f"${CRASH_ENV}: use POINT:STAGE:ITERATION, got {text!r}") from None
        if fault.point not in POINTS:
            raise ValueError(f"${CRASH_ENV}: the point is one of {', '.join(POINTS)}, got {fault.point!r}")
        return fault

    def matches(self, point: str, stage: int, iteration: int) -> bool:
        return point == self.point and stage == self.stage and iteration >= self.iteration


def _armed() -> Fault | None:
    text = os.environ.get(CRASH_ENV, "")
    if not text:
        return None
    fault = Fault.parse(text)
    logger.warning("test fault armed: crash at %s of stage %d from iteration %d", fault.point, fault.stage,
                   fault.iteration)
    return fault


ARMED: Fault | None = None  # set from $GWTF_CRASH_AT when the node starts (``arm_from_environment``)


def arm_from_environment() -> None:
    """Arm the crash point ``$GWTF_CRASH_AT`` names, if any (read when the node starts, not at import:
    a process forked from a preloaded one has its own environment)."""
    global ARMED
    ARMED = _armed()


def armed_at(point: str, stage: int, iteration: int) -> bool:
    """Whether a crash at ``point`` is armed for this stage and iteration (callers hold work back for it)."""
    return ARMED is not None and ARMED.matches(point, stage, iteration)


def armed(point: str) -> bool:
    """Whether a crash at ``point`` is armed (callers may then wait for what the point promises)."""
    return ARMED is not None and ARMED.point == point


def hit(point: str, stage: int, iteration: int, events: Events | None) -> None:
    """Crash here if the armed fault names this point (no-op when nothing is armed)."""
    if ARMED is None or not ARMED.matches(point, stage, iteration):
        return
    if events is not None:
        events.emit("fault", point=point, stage=stage, iteration=iteration, pid=os.getpid())
    sys.stdout.flush()
    if os.getpgrp() == os.getpid():  # our own process group (local swarms, tests): take DHT and p2pd along
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
