"""Verification with what gwtf already has: replicas are bit-identical, so two of them given the same input
must compute the same output. A data holder checks a random fraction of its microbatches.

Data holder side (``check``): for a sampled microbatch, the activations its head sent to a first-stage
replica go, as a check request (a forward tagged ``check``: answered, never routed on, nothing kept),
to two replicas of stage 1; their outputs must agree (within ``TOLERANCE`` of their scale: replicas on
different hardware round differently). On a mismatch a third replica decides; the one the other two
contradict is excluded (``Liveness.exclude``: no more routing to it, with the evidence in the log, the
``cross_check`` event and the record's ``excluded``). With two replicas only, the dispute is reported,
nobody excluded. Replica side (``answer``): compute the stage on the request, send the output back as
a backward tagged ``check``, computed with the weights of the microbatch's iteration (none if the part
stepped past it meanwhile). A liar that recognizes check requests can answer them honestly: what this
catches is a replica that corrupts what it computes (a modified daemon, faulty hardware).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import misbehave
from gwtfp2p.transport import Ack, TransferMeta

logger = logging.getLogger(__name__)
CHECK_TAG = "check"
TOLERANCE = 1e-4  # relative: max |a - b| <= TOLERANCE x (1 + max |a|)


class TensorSender(Protocol):
    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None: ...


def is_check(meta: TransferMeta) -> bool:
    return isinstance(meta.tags.get(CHECK_TAG), str)


def difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """How far apart two outputs are, relative to their scale (``inf`` for different shapes or non-finite)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    return diff / (1.0 + float(a.double().abs().max())) if diff == diff else float("inf")


def verdict(outputs: dict[str, torch.Tensor]) -> tuple[str, str | None, float]:
    """("agree" | "liar" | "dispute", the liar if one is outvoted, the largest relative difference)."""
    peers = sorted(outputs)
    diffs = {(p, q): difference(outputs[p], outputs[q]) for i, p in enumerate(peers) for q in peers[i + 1:]}
    worst = max(diffs.values(), default=0.0)
    if worst <= TOLERANCE:
        return "agree", None, worst
    if len(peers) >= 3:
        for p in peers:
            others = [q for q in peers if q != p]
            agree = all(diffs[tuple(sorted((a, b)))] <= TOLERANCE for i, a in enumerate(others) for b in others[i + 1:])
            if agree and all(diffs[tuple(sorted((p, q)))] > TOLERANCE for q in others):
                return "liar", p, worst
    return "dispute", None, worst


class CrossCheck:
    """Both sides of the two-replica output check for one node (``executor``: a relay's stage, else None)."""

    def __init__(self, self_id: str, *, fraction: float, rng: random.Random, replicas: Callable[[], list[str]],
                 sender: TensorSender, compute: ComputeThread, executor: Any, exclude: Callable[[str, str], object],
                 events: Events, timeout_s: float, reach: Callable[[int, float], Awaitable[bool]] | None = None,
                 part_iteration: Callable[[], int] = lambda: 0) -> None:
        self.self_id = self_id
        self.fraction = fraction
        self.rng = rng
        self.replicas = replicas  # live replicas of stage 1, for a data holder
        self.sender = sender
        self.compute = compute
        self.executor = executor
        self.exclude = exclude
        self.events = events
        self.timeout_s = timeout_s
        self.reach = reach  # waits until our part holds a given iteration's steps (the iteration gate)
        self.part_iteration = part_iteration  # the steps in the part's state (read on the compute thread)
        self.background = Background("cross-checks")
        self._waiting: dict[str, dict[str, asyncio.Future[torch.Tensor]]] = {}
        self.checks = 0

    # -- a data holder ----------------------------------------------------------------------------------
    def maybe_check(self, meta: TransferMeta, hidden: torch.Tensor, first: str) -> None:
        """Check this microbatch with probability ``fraction`` (its output went to ``first``)."""
        if self.fraction > 0 and self.rng.random() < self.fraction:
            self.background.spawn(self.check(meta, hidden, first), f"cross-check {meta.microbatch.key}")

    async def check(self, meta: TransferMeta, hidden: torch.Tensor, first: str) -> str:
        others = [p for p in self.replicas() if p != first]
        if not others:
            return "skipped"
        started = time.monotonic()
        pair = [first, self.rng.choice(others)]
        outputs = await self._ask(meta, hidden, pair)
        result, liar, worst = verdict(outputs) if len(outputs) == 2 else ("unanswered", None, 0.0)
        if result == "dispute" and len(others) >= 2:
            third = self.rng.choice([p for p in others if p not in pair])
            outputs.update(await self._ask(meta, hidden, [third]))
            result, liar, worst = verdict(outputs)
        self.checks += 1
        self.events.emit("cross_check", microbatch=meta.microbatch.key, peers=sorted(outputs), verdict=result,
                         liar=liar, max_difference=worst, seconds=round(time.monotonic() - started, 4))
        if liar is not None:
            reason = (f"cross-check of {meta.microbatch.key}: its stage-1 output differs from {len(outputs) - 1} "
                      f"other replicas' by {worst:.3g} (relative)")
            self.exclude(liar, reason)
        elif result == "dispute":
            logger.warning("cross-check of %s: %s disagree by %.3g and no third replica decides",
                           meta.microbatch.key, sorted(outputs), worst)
        return result

    async def _ask(self, meta: TransferMeta, hidden: torch.Tensor, peers: list[str]) -> dict[str, torch.Tensor]:
        nonce = f"{self.rng.getrandbits(63):x}"
        loop = asyncio.get_running_loop()
        waiting = self._waiting[nonce] = {p: loop.create_future() for p in peers}
        request = meta.model_copy(update={"tags": {CHECK_TAG: nonce}, "stage": 1})
        try:
            for peer in peers:
                ack = await self.sender.send("forward", peer, request, hidden)
                if ack is None or not ack.accepted:
                    waiting[peer].cancel()
            pending = [f for f in waiting.values() if not f.cancelled()]
            if pending:
                await asyncio.wait(pending, timeout=self.timeout_s)
            return {p: f.result() for p, f in waiting.items() if f.done() and not f.cancelled()}
        finally:
            del self._waiting[nonce]

    def on_answer(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        future = self._waiting.get(str(meta.tags.get(CHECK_TAG)), {}).get(sender)
        if future is None or future.done():
            return Ack(accepted=False, reason="no check of ours waits for this answer")
        future.set_result(tensor)
        return Ack()

    # -- a replica --------------------------------------------------------------------------------------
    def on_request(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        if self.executor is None:
            return Ack(accepted=False, reason="this node answers no cross-check")
        self.background.spawn(self._answer(sender, meta, tensor), f"check answer to {sender}")
        return Ack()

    async def _answer(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        key, t = f"check/{meta.tags[CHECK_TAG]}", meta.microbatch.iteration
        if self.reach is not None and not await self.reach(t, self.timeout_s):
            return  # the part is past the microbatch's iteration (or far from it): its weights are not those

        def compute() -> torch.Tensor | None:
            if self.reach is not None and self.part_iteration() != t:
                return None  # the part stepped before this ran
            try:
                return misbehave.corrupted(self.executor.forward(key, tensor).cpu())
            finally:
                self.executor.drop(key)

        output = await self.compute.run(compute)
        if output is not None:
            await self.sender.send("backward", sender, meta.model_copy(update={"stage": 0}), output)

    async def close(self) -> None:
        await self.background.close()
