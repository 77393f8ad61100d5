"""``DataHolderExecutor``: a data holder's head (embeddings) and tail (norm, LM head, loss).

Owns the data holder's side of one microbatch: ``head_forward`` embeds the input ids and keeps the
graph; ``tail_backward`` takes the last stage's output, computes the mean token loss and returns
the gradient to send back (adding the tail's parameter gradients once per id); ``head_backward``
takes the first stage's input gradient and adds the embeddings' gradients once per id. GPT-2's tied
``wte`` is one Parameter used at both ends: the tail's gradient rows of the microbatch's own tokens
are held until its head backward adds the embedding's, so each microbatch's gradient enters the
exact sum as the unsplit model computes it (``tail + head`` in float, then fixed point). The count
of the iteration's mean is the number of distinct microbatches whose tail ran.
"""

from __future__ import annotations

import torch
from torch import nn

from gwtfp2p.config import RunSpec
from gwtfp2p.model.ledger import Ledger, Pending, UnknownMicrobatch, dropout_seed, seeded_rng
from gwtfp2p.model.partition import DataHolderModule
from gwtfp2p.model.presets import config_dropout
from gwtfp2p.model.trainable import Trainable


def _tied_embedding(module: DataHolderModule) -> nn.Parameter | None:
    """The Parameter used by both head and tail (GPT-2's ``wte``), or None (Llama)."""
    head = {id(p) for p in module.head.parameters()}
    shared = [p for p in module.tail.parameters() if id(p) in head]
    if not shared:
        return None
    if len(shared) != 1 or shared[0] is not module.head.tokens.weight:
        raise ValueError("dataholder: only the token embedding may be shared by head and tail")
    return shared[0]


class DataHolderExecutor(Trainable):
    """One data holder's replica of the head+tail part."""

    def __init__(self, module: DataHolderModule, spec: RunSpec) -> None:
        super().__init__(module, spec, kind="dataholder")
        self.device = next(module.parameters()).device
        self._seeded = config_dropout(module.config) > 0
        self.head_ledger = Ledger(module)
        self.tail_done: dict[str, tuple[float, torch.Tensor]] = {}
        self._labels: dict[str, torch.Tensor] = {}
        self._inputs: dict[str, torch.Tensor] = {}
        self._tied = _tied_embedding(module)
        self._tokens = module.head.tokens.weight
        self._positions = module.head.positions.weight if module.head.positions is not None else None
        self._tail_params = list(module.tail.parameters())  # what a tail backward touches
        self._head_dense = [p for p in module.head.parameters() if p is not self._tokens and p is not self._positions]
        self._held_rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # tail's tied rows until head
        self.peak_tail_bytes = 0

    def head_forward(self, mb_id: str, input_ids: torch.Tensor,
                     labels: torch.Tensor | None = None) -> torch.Tensor:
        """Embed ``input_ids`` [B,T]; returns the hidden states [B,T,H] to send to stage 1.

        ``labels`` default to the input ids (next-token prediction; the loss shifts them).
        """
        vocab = self.module.config.vocab_size
        if input_ids.dim() != 2 or input_ids.is_floating_point() or input_ids.is_complex() or (
                input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < vocab):
            raise ValueError(f"dataholder: input ids must be integers [B, T] within 0..{vocab - 1}")
        ids = input_ids.to(self.device, torch.long)
        if labels is not None and labels.shape != ids.shape:
            raise ValueError(f"dataholder: labels {tuple(labels.shape)} differ from inputs {tuple(ids.shape)}")
        self._labels[mb_id] = (ids if labels is None else labels.to(self.device, torch.long)).detach()
        self._inputs[mb_id] = ids.detach()
        seed = dropout_seed(self.spec.seed, mb_id, "head") if self._seeded else None
        if mb_id in self.head_ledger.done:  # recompute the same way as a kept forward, keep nothing
            with torch.enable_grad(), seeded_rng(seed, self.device):
                return self.module.head(ids).detach()
        meter = [0]
        with torch.enable_grad(), self.head_ledger.metering(meter), seeded_rng(seed, self.device):
            out = self.module.head(ids)
        self.head_ledger.add_pending(mb_id, Pending(inputs=ids, output=out, saved_bytes=meter[0]))
        return out.detach()

    def tail_backward(self, mb_id: str, hidden: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Loss of the last stage's output ``hidden`` and its gradient (to send back to stage S).

        The first call per id adds the tail's parameter gradients and counts the microbatch; a
        duplicate returns the same loss and gradient and adds nothing.
        """
        if mb_id in self.tail_done:
            return self.tail_done[mb_id]
        labels = self._labels.get(mb_id)
        if labels is None:
            raise UnknownMicrobatch(mb_id)
        width = self.module.config.hidden_size
        if hidden.dim() != 3 or hidden.shape != (*labels.shape, width) or not hidden.is_floating_point():
            raise ValueError(f"dataholder: last hidden {tuple(hidden.shape)} does not fit labels "
                             f"{tuple(labels.shape)} for {mb_id}")
        x = hidden.detach().to(self.device, self.grad_dtype).requires_grad_(True)
        meter = [0]
        with torch.enable_grad():
            with self.head_ledger.metering(meter):
                loss = self.module.tail(x, labels)
            loss.backward()
        self._hold_tied_rows(mb_id)
        self._fold(self._tail_params)
        self.peak_tail_bytes = max(self.peak_tail_bytes, meter[0])
        result = (float(loss.detach()), x.grad.detach())
        self.tail_done[mb_id] = result
        self.count += 1
        return result

    def head_backward(self, mb_id: str, grad_hidden: torch.Tensor) -> None:
        """Add the embeddings' gradients for ``mb_id`` from stage 1's input gradient (once per id)."""
        if mb_id in self.head_ledger.done:
            return
        entry = self.head_ledger.peek(mb_id)
        if grad_hidden.shape != entry.output.shape:
            raise ValueError(f"dataholder: gradient shape {tuple(grad_hidden.shape)} != embeddings "
                             f"{tuple(entry.output.shape)} for {mb_id}")
        self.head_ledger.take(mb_id)
        grad = grad_hidden.detach().to(entry.output.device, entry.output.dtype)
        torch.autograd.backward(entry.output, grad)
        self._restore_tied_rows(mb_id)
        self._fold_head(mb_id)
        self.head_ledger.done[mb_id] = None

    def _fold_head(self, mb_id: str) -> None:
        """Fold a head backward: the embeddings' rows this microbatch used (its tokens; positions
        0..T-1), anything else of the head dense."""
        ids = self._inputs[mb_id]
        self._fold_rows(self._tokens, torch.unique(ids))
        if self._positions is not None:
            self._fold_rows(self._positions, torch.arange(ids.shape[1], device=ids.device))
        self._fold(self._head_dense)

    # -- the tied embedding: a microbatch's tail rows wait for its head rows ----------------------
    def _hold_tied_rows(self, mb_id: str) -> None:
        """Take the tied weight's gradient rows of ``mb_id``'s tokens out of the buffer, to add later."""
        if self._tied is None:
            return
        rows = torch.unique(self._inputs[mb_id])
        grad = self._tied.grad
        self._held_rows[mb_id] = (rows, grad.index_select(0, rows))
        grad.index_fill_(0, rows, 0.0)

    def _restore_tied_rows(self, mb_id: str) -> None:
        """Add the held tail rows to the head's rows of the same microbatch (float, as autograd does)."""
        held = self._held_rows.pop(mb_id, None)
        if held is not None:
            rows, tail = held
            grad = self._tied.grad
            grad.index_copy_(0, rows, grad.index_select(0, rows).add_(tail))

    def _release_tied_rows(self, mb_id: str) -> None:
        """A microbatch whose head backward will not come: its tail rows enter the sum alone."""
        held = self._held_rows.pop(mb_id, None)
        if held is not None:
            rows, tail = held
            self._tied.grad.index_copy_(0, rows, tail)
            self._fold_rows(self._tied, rows)

    def _finish_backward(self) -> None:
        for mb_id in sorted(self._held_rows):
            self._release_tied_rows(mb_id)

    def drop(self, mb_id: str) -> bool:
        """Forget a microbatch's head state and labels; True if a head state was held.

        Gradients its tail already added stay in the sum (with its count).
        """
        self._release_tied_rows(mb_id)
        self._labels.pop(mb_id, None)
        self._inputs.pop(mb_id, None)
        return self.head_ledger.free(mb_id)

    def loss(self, mb_id: str) -> float | None:
        """The loss computed for ``mb_id`` this iteration, if its tail ran."""
        done = self.tail_done.get(mb_id)
        return None if done is None else done[0]

    def _end_iteration(self) -> int:
        self.tail_done.clear()
        self._labels.clear()
        self._inputs.clear()
        self._held_rows.clear()
        return self.head_ledger.end_iteration()

    def memory_stats(self) -> dict[str, int]:
        """Bytes: parameters+grads+AdamW moments, head activations saved now and at peak, and the
        peak a tail call saves while it runs (logits etc., freed when it returns)."""
        return {"parameter_bytes": self.parameter_bytes(),
                "saved_activation_bytes": self.head_ledger.saved_bytes,
                "peak_saved_activation_bytes": self.head_ledger.peak_saved_bytes,
                "activation_bytes_per_microbatch": self.head_ledger.max_microbatch_bytes,
                "peak_tail_activation_bytes": self.peak_tail_bytes}
