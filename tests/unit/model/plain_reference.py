"""A single-process trainer written on plain transformers classes only (none of the project's model code).

The config is written out by hand from the tiny presets' published shapes (docs/model.md), the
model is ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` built after ``torch.manual_seed(seed)``, the
loss is the model's own (``labels=input_ids``), and AdamW is a loop written here (decoupled weight
decay on matrices and embeddings, bias correction, in the operation order of torch's documented
algorithm). Two ways to form the iteration's gradient:

* ``"exact"``: the arithmetic docs/model.md specifies, written from its text: each microbatch's
  gradient alone, rounded to multiples of 2**-40, summed as int64, divided by the count in
  float64, rounded to float32; the global norm from float64 squares summed by a pairwise tree per
  tensor and exactly over tensors; the clip factor ``float32(max_norm / (norm + 1e-6))``.
* ``"conventional"``: what one usually writes: ``loss.backward()`` per microbatch accumulating
  into ``.grad`` in float32, ``/= n``, ``torch.nn.utils.clip_grad_norm_`` over the whole model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

TINY = {"layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "llama_intermediate": 64, "positions": 256}
GRADIENTS = ("exact", "conventional")


def plain_model(family: str, vocab_size: int, seed: int) -> torch.nn.Module:
    """The tiny preset's model, dropout off, initialized by transformers after seeding torch."""
    if family == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_positions=TINY["positions"], n_embd=TINY["hidden"],
                            n_layer=TINY["layers"], n_head=TINY["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
        cls = GPT2LMHeadModel
    else:
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=TINY["hidden"],
                             intermediate_size=TINY["llama_intermediate"], num_hidden_layers=TINY["layers"],
                             num_attention_heads=TINY["heads"], num_key_value_heads=TINY["kv_heads"],
                             max_position_embeddings=TINY["positions"], tie_word_embeddings=False,
                             bos_token_id=None, eos_token_id=None)
        cls = LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    model.train()
    return model


def _pairwise_sq(t: torch.Tensor, block: int = 1 << 16) -> float:
    """float64 squares of ``t``, summed per zero-padded block of ``block`` by halving, then the block
    sums (zero-padded to a power of two) by halving. (A tensor smaller than a block is padded to the
    next power of two only: the halvings skipped would add zeros.)"""
    x = t.detach().double().reshape(-1) ** 2
    block = min(block, 1 << (len(x) - 1).bit_length())
    x = torch.cat([x, x.new_zeros(-len(x) % block)]).view(-1, block)
    while x.shape[1] > 1:
        x = x[:, : x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    sums = x[:, 0]
    sums = torch.cat([sums, sums.new_zeros((1 << (len(sums) - 1).bit_length()) - len(sums))])
    while len(sums) > 1:
        sums = sums[: len(sums) // 2] + sums[len(sums) // 2:]
    return float(sums[0])


class PlainTrainer:
    """Gradient over an iteration's microbatches, global clipping, hand-written AdamW."""

    def __init__(self, model: torch.nn.Module, *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, max_norm: float, gradient: str = "exact") -> None:
        if gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}")
        self.model, self.gradient = model, gradient
        self.params = list(model.parameters())  # GPT-2's tied wte/lm_head appears once
        self.lr, self.betas, self.eps, self.weight_decay, self.max_norm = lr, betas, eps, weight_decay, max_norm
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0
        self.clipped = 0  # iterations in which the clip scaled the gradient

    def step(self, microbatches: Sequence[torch.Tensor]) -> list[float]:
        """One iteration; returns each microbatch's loss."""
        if self.gradient == "exact":
            losses = self._exact_mean(microbatches)
            norm = math.sqrt(math.fsum(_pairwise_sq(p.grad) for p in self.params))
            coefficient = self.max_norm / (norm + 1e-6)
            if coefficient < 1:
                factor = torch.tensor(coefficient, dtype=torch.float32)
                for p in self.params:
                    p.grad.mul_(factor)
        else:
            losses = self._float_mean(microbatches)
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_norm))
        self.clipped += norm > self.max_norm
        self._adamw()
        return losses

    def _loss_backward(self, ids: torch.Tensor) -> float:
        loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return float(loss.detach())

    def _float_mean(self, microbatches: Sequence[torch.Tensor]) -> list[float]:
        for p in self.params:
            p.grad = None
        losses = [self._loss_backward(ids) for ids in microbatches]
        for p in self.params:
            p.grad /= len(microbatches)
        return losses

    def _exact_mean(self, microbatches: Sequence[torch.Tensor]) -> list[float]:
        sums = [torch.zeros(p.shape, dtype=torch.int64) for p in self.params]
        losses = []
        for ids in microbatches:
            for p in self.params:
                p.grad = None
            losses.append(self._loss_backward(ids))
            for s, p in zip(sums, self.params, strict=True):
                s += torch.round(p.grad * 2.0**40).to(torch.int64)
        for s, p in zip(sums, self.params, strict=True):
            p.grad = (s.double() / (len(microbatches) * 2.0**40)).float()
        return losses

    @torch.no_grad()
    def _adamw(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        step_size = self.lr / (1 - b1 ** self.t)
        bias2_sqrt = (1 - b2 ** self.t) ** 0.5
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            g = p.grad
            if p.dim() >= 2:  # decoupled weight decay, matrices and embeddings only
                p.mul_(1 - self.lr * self.weight_decay)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(self.eps), value=-step_size)
