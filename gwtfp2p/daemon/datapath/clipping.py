"""Global-norm clipping across the pipeline: every part's squared gradient norm reaches every part.

A single process clips the whole model by one norm; a swarm's parts (the data holders' head and tail,
each stage) hold slices of the model on different machines. Once a part's replicas have reduced
iteration t, each relay replica sends its part's squared norm to every data holder (``PartNorm``); the
data holders add every part's (their own included, ``gradnorm.global_sq_norm``: exact, any order) and
tell every relay and the other data holders the total (``StepNorm``; a data holder still waiting for a
stage's norm adopts it: a relay stops sending its norm once one total came back, so the data holders must
not each time out alone and clip by different totals); every part then steps with the same clip factor. Lost
messages are sent again every ``norm_resend_s`` (a data holder that knows the total answers a late
``PartNorm`` with it); a data holder waits for a stage at most ``aggregation_timeout_s``. A relay whose data
holders are all more than ``KEEP_ITERATIONS`` past t (a replica cut off mid-step by an outage: the others
stepped without it) gets no total any more; it clips by its own part's norm, and re-syncs next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.wire import PartNorm, StepNorm, encode_control
from gwtfp2p.model.gradnorm import global_sq_norm
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)
KEEP_ITERATIONS = 8  # totals kept for late askers


def _wire(sq_norm: float) -> float | None:
    return sq_norm if math.isfinite(sq_norm) else None


def _value(sq_norm: float | None) -> float:
    return math.nan if sq_norm is None else sq_norm


def _agreed(by_replica: dict[str, float]) -> float:
    """A stage's norm: what most of its replicas sent (bit-identical replicas agree; ties: the smallest)."""
    counts = Counter(by_replica.values())
    return min(counts, key=lambda value: (-counts[value], value if value == value else math.inf))


class ControlSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


class GlobalClip:
    """The exchange of squared norms for one node of stage ``stage`` (0: a data holder)."""

    def __init__(self, stage: int, n_stages: int, *, view: SwarmView, transport: ControlSender,
                 timings: Timings, clock: Callable[[], float]) -> None:
        self.stage = stage
        self.n_stages = n_stages
        self.view = view
        self.transport = transport
        self.timings = timings
        self.clock = clock
        self.background = Background("global clipping")
        self._norms: dict[int, dict[int, dict[str, float]]] = {}  # data holders: t -> stage -> replica -> norm
        self._totals: dict[int, float] = {}  # iteration -> the whole model's squared norm
        self._changed = asyncio.Event()

    # -- a data holder ---------------------------------------------------------------------------
    async def total(self, t: int, own_sq: float, resend_closed: Callable[[set[int]], Awaitable[None]]) -> float:
        """Wait for every stage's norm of ``t`` (telling the stages still missing, again, that t is over),
        add ours, tell every relay and the other data holders the total, and return it (or adopt the total
        another data holder sent first)."""
        deadline = self.clock() + self.timings.aggregation_timeout_s
        while True:
            if t in self._totals:  # another data holder added them all first: its total is ours
                return self._totals[t]
            norms = self._norms.get(t, {})
            missing = set(range(1, self.n_stages + 1)) - set(norms)
            if not missing:
                break
            if self.clock() > deadline:
                logger.warning("iteration %d: no squared norm from stage(s) %s within %.0f s; clipping by the "
                               "others'", t, sorted(missing), self.timings.aggregation_timeout_s)
                break
            if not await self._wait():
                await resend_closed(missing)
        total = global_sq_norm([own_sq, *(_agreed(norms[k]) for k in sorted(norms))])
        self._remember(t, total)
        peers = list(self.view.records)  # the relays and the other data holders
        await asyncio.gather(*(self._send(p, StepNorm(iteration=t, total_sq_norm=_wire(total))) for p in peers))
        return total

    def on_part_norm(self, sender: str, message: PartNorm) -> None:
        record = self.view.seen.get(sender)  # a record lapsed under load still names the sender's stage
        if record is None or record.role != "relay" or record.stage != message.stage:
            self.view.poke()  # a replica we do not know yet: it sends again
            return
        if message.iteration in self._totals:  # a late one: it waits for the total we sent already
            answer = StepNorm(iteration=message.iteration, total_sq_norm=_wire(self._totals[message.iteration]))
            self.background.spawn(self._send(sender, answer), f"step norm to {sender}")
            return
        self._norms.setdefault(message.iteration, {}).setdefault(message.stage, {})[sender] = _value(message.sq_norm)
        self._changed.set()

    # -- a relay -----------------------------------------------------------------------------------
    async def total_for_stage(self, t: int, own_sq: float) -> float:
        """Send our part's norm of ``t`` to every data holder until one of them tells us the total."""
        report = PartNorm(iteration=t, stage=self.stage, sq_norm=_wire(own_sq))
        while t not in self._totals:
            holders = [r for r in self.view.by_stage(0) if r.state != "leaving"]
            if holders and all(r.iteration > t + KEEP_ITERATIONS for r in holders):  # none keeps its total now
                logger.warning("iteration %d: every data holder is past iteration %d and has forgotten its total; "
                               "clipping by our part's own norm (the others stepped without us)", t,
                               t + KEEP_ITERATIONS)
                return own_sq
            await asyncio.gather(*(self._send(r.peer_id, report) for r in holders))
            if t not in self._totals:
                await self._wait()
        total = self._totals[t]
        return own_sq if total < own_sq else total  # a data holder's total cannot be below our part's own

    def on_step_norm(self, sender: str, message: StepNorm) -> None:
        """The total of a data holder (to a relay, or to another data holder, which adopts it)."""
        record = self.view.seen.get(sender)
        if record is None or record.role != "data":
            self.view.poke()
            return
        self._remember(message.iteration, _value(message.total_sq_norm))
        self._changed.set()

    # -- both ------------------------------------------------------------------------------------
    def _remember(self, t: int, total: float) -> None:
        self._totals.setdefault(t, total)
        for old in [i for i in self._totals if i < t - KEEP_ITERATIONS]:
            del self._totals[old]
        for old in [i for i in self._norms if i <= t]:
            del self._norms[old]

    async def _wait(self) -> bool:
        """Until a norm arrives or ``norm_resend_s`` passes; whether one arrived."""
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), self.timings.norm_resend_s)
            return True
        return False

    async def _send(self, peer: str, message: PartNorm | StepNorm) -> None:
        try:
            await self.transport.send_flow(peer, encode_control(message), timeout_s=self.timings.message_timeout_s)
        except TransportError as e:
            logger.debug("%s to %s lost: %s", message.kind, peer, e)

    async def close(self) -> None:
        await self.background.close()
