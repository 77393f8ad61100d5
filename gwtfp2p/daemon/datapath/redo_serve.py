"""A part whose step lost nothing, serving a neighbouring stage's chained redo (``redo_chain``'s uneven pair).

Two neighbouring replicas die in one iteration and only one of them had sent its sum. The stage whose sum
died redoes its work (``redo``); but some of those microbatches went through the other dead replica, whose
stage's step lost nothing and so redoes nothing. That stage's survivors serve instead:

* a rebuilt input pushed up to them (``Chain``, the stage below redoes) gets its output gradient, asked of the
  stage above by key (it went to the dead replica, a member of our step), is redone for its input gradient
  alone (our sum is untouched: the dead replica's is in it) and the input gradient goes down;
* a ``wire.Rebuild`` from the stage above (it redoes, and lacks inputs the dead replica here computed) gets the
  inputs asked of the stage below by key, recomputed bitwise (``StageExecutor.recompute``) and pushed up.

Served from the end of our aggregation (after our own redo, if any) while we still aggregate that iteration
(our weights have not moved), each key once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.datapath.redo_chain import Chain, Halves, Redoable
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.transport import MicrobatchId

logger = logging.getLogger(__name__)
SERVED_ORIGIN = "served"  # the throwaway sum of a served redo (only its input gradients are used)
Collect = Callable[[int, tuple[str, ...], tuple[MicrobatchId, ...], str], Awaitable[tuple[Halves, list[str]]]]


class Serving:
    """One relay's service to its neighbours' redo of the iterations its own step lost nothing of.
    ``collect(t, members, microbatches, side)`` asks the stage ``side`` ("above" or "below") for what it kept
    of those microbatches; ``aggregating()`` is the iteration this part aggregates."""

    def __init__(self, stage: int, *, chain: Chain, executor: Redoable, compute: ComputeThread, collect: Collect,
                 aggregating: Callable[[], int], max_asked: Callable[[int], int], background: Background) -> None:
        self.stage, self.chain, self.executor, self.compute = stage, chain, executor, compute
        self.collect, self.aggregating, self.max_asked = collect, aggregating, max_asked
        self.background = background
        self._open: dict[int, tuple[str, ...]] = {}  # iterations served -> our step's members
        self._done: dict[int, set[str]] = {}  # keys served (either way), by iteration
        self._asked: dict[int, dict[str, MicrobatchId]] = {}  # outputs the stage above asked us to rebuild
        self._lock = asyncio.Lock()  # one ``collect`` of an iteration at a time (answers are routed by it)

    def open(self, t: int, members: tuple[str, ...]) -> None:
        """Our aggregation of ``t`` is over: serve what came for it and what comes until our step."""
        self._open = {i: m for i, m in self._open.items() if i >= t - 1} | {t: members}
        self._done = {i: k for i, k in self._done.items() if i >= t - 1}
        self._asked = {i: k for i, k in self._asked.items() if i >= t - 1}
        self.poke(t)

    def on_rebuild(self, t: int, ids: tuple[MicrobatchId, ...]) -> None:
        asked = self._asked.setdefault(t, {})
        for mb in ids:
            if len(asked) < self.max_asked(t):
                asked.setdefault(mb.key, mb)
        self.poke(t)

    def poke(self, t: int) -> None:
        """Something came for ``t`` (a rebuilt input, a request): serve it if ``t`` is open."""
        if t in self._open:
            self.background.spawn(self._serve(t), f"serving the chained redo of iteration {t}")

    async def _serve(self, t: int) -> None:
        async with self._lock:
            done = self._done.setdefault(t, set())
            came = self.chain.came(t)
            inputs = sorted(came.inputs.keys() - done)
            rebuilds = sorted(self._asked.get(t, {}).keys() - done - self.chain.pushed(t))
            done.update(inputs, rebuilds)
            if inputs:
                await self._grads_down(t, came, inputs)
            if rebuilds:
                await self._outputs_up(t, [self._asked[t][k] for k in rebuilds])

    async def _grads_down(self, t: int, came: Halves, keys: list[str]) -> None:
        halves, unanswered = await self.collect(t, self._open[t], tuple(came.ids[k] for k in keys), "above")
        items = [(k, came.inputs[k], halves.grads[k]) for k in keys if k in halves.grads]
        if self.aggregating() != t or not items:  # we stepped meanwhile (the weights moved), or nothing came
            logger.info("stage %d iteration %d: %d rebuilt inputs not served (%d gradients came, no answer from %s)",
                        self.stage, t, len(keys), len(items), unanswered or "none")
            return
        try:
            _, grads_in = await self.compute.run(self.executor.redo, SERVED_ORIGIN, items)
        except ValueError as e:
            logger.warning("stage %d iteration %d: rebuilt inputs not served: %s", self.stage, t, e)
            return
        chained = Halves(ids=dict(came.ids), whose=dict(halves.whose), chained={k for k, _, _ in items})
        await self.chain.push_down(chained, grads_in)
        logger.info("stage %d iteration %d: %d rebuilt inputs of stage %d served (their input gradients went "
                    "down)", self.stage, t, len(items), self.stage)

    async def _outputs_up(self, t: int, ids: list[MicrobatchId]) -> None:
        halves, unanswered = await self.collect(t, self._open[t], tuple(ids), "below")
        keys = [mb.key for mb in ids if mb.key in halves.inputs]
        if self.aggregating() != t or not keys:
            logger.info("stage %d iteration %d: %d outputs asked for not rebuilt (%d inputs came, no answer from %s)",
                        self.stage, t, len(ids), len(keys), unanswered or "none")
            return
        await self.chain.push_up(t, halves, keys)
