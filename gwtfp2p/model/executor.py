"""``StageExecutor``: one relay's stage replica, driven per microbatch id by the daemon.

Owns the forward/backward protocol of a stage on plain tensors: forward keeps what backward needs;
a duplicate forward recomputes (same input, bitwise the same output: dropout is off or seeded per
(microbatch, stage)); backward adds parameter gradients to the exact sum once per id per iteration
and returns the input gradient, which is kept so a duplicate backward is answered without
recomputing or double counting; ``drop`` frees a microbatch whose data holder is gone. Each data
holder's microbatches are summed apart until the iteration's members are known: ``count_only``
names the data holders whose microbatches the contribution counts (those the data holders' own
aggregation kept), so a dead data holder's microbatch counts in every part or in none, however the
timing went. Not thread-safe: the daemon calls it from its single compute thread.
"""

from __future__ import annotations

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.fixedpoint import FixedPointSum, add_bounds
from gwtfp2p.model.ledger import Ledger, Pending, dropout_seed, seeded_rng
from gwtfp2p.model.partition import StageModule
from gwtfp2p.model.presets import config_dropout
from gwtfp2p.model.trainable import Trainable


class StageExecutor(Trainable):
    """Stage ``stage_index`` (1-based, as in docs/design.md) of the pipeline, one replica."""

    def __init__(self, module: StageModule, spec: RunSpec, stage_index: int) -> None:
        super().__init__(module, spec, kind=f"stage{stage_index}")
        self.stage_index = stage_index
        self.device = next(module.parameters()).device
        self._seeded = config_dropout(module.config) > 0
        self.ledger = Ledger(module)
        # this iteration's exact sum and count per data holder (the first one seen uses the base sum's buffer)
        self._by_origin: dict[str, tuple[FixedPointSum, int]] = {}
        self._counted: frozenset[str] | None = None  # the data holders the contribution counts (None: all)

    def _seed(self, mb_id: str) -> int | None:
        return dropout_seed(self.spec.seed, mb_id, self.kind) if self._seeded else None

    def forward(self, mb_id: str, hidden: torch.Tensor) -> torch.Tensor:
        """Run the stage on ``hidden`` [B,T,H] for ``mb_id``; returns the (detached) output.

        For an id already done this iteration the output is recomputed without keeping state;
        otherwise the forward state is kept (replacing any earlier one of the same id).
        """
        self._check_input(mb_id, hidden, "input")
        if mb_id in self.ledger.done:
            return self.recompute(mb_id, hidden)
        x = hidden.detach().to(self.device, self.grad_dtype).requires_grad_(True)
        meter = [0]
        with torch.enable_grad(), self.ledger.metering(meter), seeded_rng(self._seed(mb_id), self.device):
            out = self.module(x)
        self.ledger.add_pending(mb_id, Pending(inputs=x, output=out, saved_bytes=meter[0]))
        return out.detach()

    def recompute(self, mb_id: str, hidden: torch.Tensor) -> torch.Tensor:
        """The output a forward of ``hidden`` for ``mb_id`` gives, bitwise (the same kernels, grad mode on, and
        dropout seed), keeping nothing: a duplicate forward, or a lost replica's output redone for the next stage."""
        self._check_input(mb_id, hidden, "input")
        x = hidden.detach().to(self.device, self.grad_dtype).requires_grad_(True)
        with torch.enable_grad(), seeded_rng(self._seed(mb_id), self.device):
            return self.module(x).detach()

    def _check_input(self, mb_id: str, hidden: torch.Tensor, what: str) -> None:
        width = self.module.config.hidden_size
        if hidden.dim() != 3 or hidden.shape[-1] != width or not hidden.is_floating_point():
            raise ValueError(f"{self.kind}: {what} must be float [B, T, {width}], got {hidden.dtype} "
                             f"{tuple(hidden.shape)} for {mb_id}")

    def backward(self, mb_id: str, grad_output: torch.Tensor, origin: str = "") -> torch.Tensor:
        """Backpropagate ``grad_output`` for ``mb_id``; returns the gradient wrt the stage input.

        The first backward of an id adds its parameter gradients (computed alone, then converted to
        fixed point) to the exact sum of its data holder ``origin`` and counts it; a later one returns
        the same input gradient and adds nothing. Raises ``UnknownMicrobatch`` if the
        id has neither forward state nor a finished backward here.
        """
        if mb_id in self.ledger.done:
            return self.ledger.done[mb_id]
        entry = self.ledger.peek(mb_id)
        if grad_output.shape != entry.output.shape:
            raise ValueError(f"{self.kind}: gradient shape {tuple(grad_output.shape)} != output "
                             f"{tuple(entry.output.shape)} for {mb_id}")
        self.ledger.take(mb_id)
        grad = grad_output.detach().to(device=entry.output.device, dtype=entry.output.dtype)
        torch.autograd.backward(entry.output, grad)
        self._fold_for(origin)
        grad_input = entry.inputs.grad.detach()
        self.ledger.done[mb_id] = grad_input
        self.count += 1
        return grad_input

    def _fold_for(self, origin: str) -> None:
        """Fold the last backward into the sum of data holder ``origin`` and count it there."""
        held = self._by_origin.get(origin)
        if held is None:
            held = (self._sum if not self._by_origin else FixedPointSum(self.numel, self._flat.device), 0)
        base, self._sum = self._sum, held[0]
        try:
            self._fold()
        finally:
            self._sum = base
        self._by_origin[origin] = (held[0], held[1] + 1)

    def count_only(self, origins: tuple[str, ...] | frozenset[str] | None) -> None:
        """This iteration's contribution counts the microbatches of data holders ``origins`` only (None: all):
        the members of the data holders' aggregation, which every part learns alike (``Closed``)."""
        self._counted = None if origins is None else frozenset(origins)

    def counted(self) -> int:
        """The microbatches this iteration's contribution counts (``count`` is every backward taken)."""
        return sum(n for origin, (_, n) in self._by_origin.items() if self._is_counted(origin))

    def _is_counted(self, origin: str) -> bool:
        return self._counted is None or origin in self._counted

    def grad_contribution(self, replica_id: str) -> GradContribution:
        """The exact sum and count of the counted data holders' microbatches (every one's unless ``count_only``
        said otherwise): bitwise what one sum of those microbatches alone would hold."""
        sums = [held for origin, (held, _) in self._by_origin.items() if self._is_counted(origin)]
        total = torch.zeros(self.numel, dtype=torch.int64)
        for held in sums:
            total.add_(held.total.detach().to("cpu"))
        return GradContribution(replica_id, total, self.counted(), add_bounds(0, *(h.bound for h in sums)))

    def redo(self, origin: str, items: list[tuple[str, torch.Tensor, torch.Tensor]]
             ) -> tuple[GradContribution, dict[str, torch.Tensor]]:
        """The parameter gradients of ``items`` (microbatch id, the stage's input, its output's gradient, as
        another replica got them), in a sum of their own: that replica's lost contribution, bitwise what it
        added (the same kernels, dropout seeds and fixed-point sum); with each microbatch's input gradient
        (what it sent back). The iteration's own sum, count and forward states are untouched. ``ValueError``
        for a tensor of the wrong shape."""
        own, self._sum = self._sum, FixedPointSum(self.numel, self._flat.device)
        grads_in: dict[str, torch.Tensor] = {}
        try:
            for mb_id, hidden, grad_output in items:
                self._check_input(mb_id, hidden, "redo input")
                x = hidden.detach().to(self.device, self.grad_dtype).requires_grad_(True)
                with torch.enable_grad(), seeded_rng(self._seed(mb_id), self.device):
                    out = self.module(x)
                if grad_output.shape != out.shape:
                    raise ValueError(f"{self.kind}: redo gradient {tuple(grad_output.shape)} != output "
                                     f"{tuple(out.shape)} for {mb_id}")
                torch.autograd.backward(out, grad_output.detach().to(device=out.device, dtype=out.dtype))
                self._fold()
                grads_in[mb_id] = x.grad.detach()
            total = self._sum.total.detach().to("cpu", copy=True)
            return GradContribution(origin, total, len(items), self._sum.bound), grads_in
        finally:
            self._flat.zero_()
            self._sum = own

    def drop(self, mb_id: str) -> bool:
        """Free a microbatch's forward state (its data holder crashed); True if some was held."""
        return self.ledger.free(mb_id)

    def status(self, mb_id: str) -> str:
        """``"done"``, ``"pending"`` or ``"unknown"`` for ``mb_id`` in the current iteration."""
        return self.ledger.status(mb_id)

    def _end_iteration(self) -> int:
        self._by_origin.clear()  # the base sum was cleared by the caller; the others are dropped
        self._counted = None
        return self.ledger.end_iteration()

    def memory_stats(self) -> dict[str, int]:
        """Bytes: parameters+grads+AdamW moments, activations saved now, at peak, and per microbatch."""
        return {"parameter_bytes": self.parameter_bytes(), "saved_activation_bytes": self.ledger.saved_bytes,
                "peak_saved_activation_bytes": self.ledger.peak_saved_bytes,
                "activation_bytes_per_microbatch": self.ledger.max_microbatch_bytes}
