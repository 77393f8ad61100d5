"""A part's state as its replicas share it: the step (with the step log kept), and serving it to joiners.

``PartState`` owns the trainable part's side of aggregation on the compute thread: its contribution as
it travels and the agreed ones decoded (``encoding``), applying them (``Trainable.apply_step``),
recording the step for joiners that must replay it (``steplog``), and the state's iteration, consistent
with its bytes. ``StateServer`` answers the transport's state and step-replay downloads between
aggregation steps.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gwtfp2p.daemon.aggregation.encoding import ContributionCodec, WireContribution
from gwtfp2p.daemon.aggregation.steplog import StepLog, replay_capacity
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.steps_wire import encode_steps
from gwtfp2p.daemon.testing import testpoints
from gwtfp2p.model.trainable import StepResult, Trainable
from gwtfp2p.transport import StateBlob


class PartState:
    """The part, its step log and the iteration its state holds (all touched on the compute thread)."""

    def __init__(self, part: Trainable, from_iteration: int, replay_steps: int, replay_budget_bytes: int,
                 state_hash: str = "") -> None:
        self.part = part
        self.iteration = from_iteration  # steps contained in the part's state
        self.steps = StepLog(replay_capacity(replay_steps, replay_budget_bytes, part.numel))
        # After the last step taken here, or of the state the node joined with (the event loop reads it)
        self.last_hash = state_hash
        self.codec = ContributionCodec(part.spec.aggregate_codec, part.numel)

    @property
    def global_clip(self) -> bool:
        """Whether a step clips by the whole model's norm (the run's ``clip_mode``), not the part's own."""
        return self.part.spec.clip_mode == "global"

    @property
    def screen_factor(self) -> float:
        """The run's robust-aggregation factor (``RunSpec.screen_factor``; 0: no screen)."""
        return self.part.spec.screen_factor

    def own_contribution(self, self_id: str) -> WireContribution:
        """On the compute thread: ours as it travels (the exact fixed-point sum, on the CPU, or its encoding
        under the run's aggregate codec: every member reduces alike)."""
        return self.codec.encode(self.part.grad_contribution(self_id))

    def reduce(self, contributions: list[WireContribution]) -> tuple[torch.Tensor, int, float]:
        """On the compute thread: (mean gradient, count, the part's squared gradient norm) of the
        contributions as they travelled, ours included."""
        mean, count = self.part.reduce([self.codec.decode(c) for c in contributions])
        return mean, count, self.part.grad_sq_norm(mean)

    def apply(self, mean: torch.Tensor, count: int, iteration: int, total_sq_norm: float | None) -> StepResult:
        """On the compute thread: the step (clipped by ``total_sq_norm``, the whole model's, in global
        clipping), the step log (for joiners to replay) and the state's iteration with it."""
        step = self.part.apply_mean(mean, count, total_sq_norm=total_sq_norm)
        self.steps.record(iteration, mean, count, step.state_hash, total_sq_norm)
        self.iteration = iteration + 1
        self.last_hash = step.state_hash
        return step

    def reset(self, iteration: int, state_hash: str) -> None:
        """The part's state was replaced by a replica's of ``iteration`` steps (``resync``): the steps
        logged here are not the stage's any more."""
        self.iteration, self.last_hash = iteration, state_hash
        self.steps = StepLog(self.steps.capacity)

    def discard_gradients(self) -> int:
        """On the compute thread, after ``reset``: forget the gradients gathered for an iteration this
        part no longer steps (they must not ride in a later iteration's contribution); how many
        backwards they held."""
        count = self.part.count
        self.part.discard_gradients()
        return count

    def snapshot(self) -> tuple[int, bytes]:
        """On the compute thread: (iteration, state bytes), consistent with each other."""
        return self.iteration, self.part.state_bytes()

    def steps_since(self, iteration: int) -> tuple[int, bytes] | None:
        """On the compute thread: (our iteration, the encoded steps from ``iteration`` on), or None if they
        are not all kept any more."""
        steps = self.steps.since(iteration)
        return None if steps is None else (self.iteration, encode_steps(steps))


class StepGate(Protocol):
    async def wait_idle(self, timeout_s: float | None = None) -> bool: ...


class StateServer:
    """Serves ``PartState`` of stage ``stage`` to joiners (the transport's ``get_state``/``get_steps``)."""

    def __init__(self, stage: int, state: PartState, *, compute: ComputeThread, gate: StepGate, events: Events,
                 state_wait_s: float) -> None:
        self.stage = stage
        self.state = state
        self.compute = compute
        self.gate = gate
        self.events = events
        self.state_wait_s = state_wait_s

    async def get_state(self, stage: int) -> StateBlob | None:
        if stage != self.stage:
            return None
        await testpoints.delay("serve_state", self.events)  # tests only ($GWTF_DELAY_AT)
        if not await self.gate.wait_idle(self.state_wait_s):
            return None
        iteration, data = await self.compute.run(self.state.snapshot)
        return StateBlob(stage=stage, iteration=iteration, data=data)

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        """The steps this replica took since ``since_iteration`` (None: not all kept, or not our part)."""
        if stage != self.stage:
            return None
        # No wait for the step: the log and our iteration change together on the compute thread, and a
        # joiner that reserved the iteration we are aggregating needs the steps before it right now.
        replay = await self.compute.run(self.state.steps_since, since_iteration)
        return None if replay is None else StateBlob(stage=stage, iteration=replay[0], data=replay[1])
