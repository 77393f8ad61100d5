"""Split a transformers causal LM into the data holder's head+tail and S relay stages.

Owns the partition rule (balanced or explicit layer counts) and the three module kinds: a
``StageModule`` (contiguous decoder layers; it rebuilds position ids, the causal mask and, for
Llama, the rotary embeddings from the hidden states' shape, so only one tensor crosses each hop),
and the ``DataHolderModule`` (embeddings + final norm, LM head and loss; GPT-2's tied ``wte`` is one
Parameter used at both ends). Sequences are unpadded windows of equal length. The split modules
share Parameters with the model they were cut from; copy them for independent replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.masking_utils import create_causal_mask

from gwtfp2p.config import ConfigError


def balanced_partition(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Layer counts per stage differing by at most one; earlier stages take the remainder."""
    if not 1 <= n_stages <= n_layers:
        raise ConfigError(f"--stages: need 1 <= stages <= {n_layers} (the model's layers), got {n_stages}")
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if k < extra else 0) for k in range(n_stages))


def resolve_partition(n_layers: int, n_stages: int, explicit: Sequence[int] = ()) -> tuple[int, ...]:
    """The explicit partition if given (validated against the model), else the balanced one."""
    if not explicit:
        return balanced_partition(n_layers, n_stages)
    if len(explicit) != n_stages or any(n < 1 for n in explicit) or sum(explicit) != n_layers:
        raise ConfigError(f"--partition: {tuple(explicit)} must give {n_stages} stages of >= 1 layer "
                          f"summing to the model's {n_layers} layers")
    return tuple(explicit)


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class StageModule(nn.Module):
    """Decoder layers ``first_layer .. first_layer+len(layers)-1``: hidden [B,T,H] -> hidden [B,T,H]."""

    def __init__(self, family: str, config: PretrainedConfig, layers: Sequence[nn.Module],
                 rotary: nn.Module | None, first_layer: int) -> None:
        super().__init__()
        self.family = family
        self.config = config
        self.first_layer = first_layer
        self.layers = nn.ModuleList(layers)
        self.rotary = rotary

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        position_ids = _positions(hidden)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=position_ids)
        if self.family == "gpt2":
            for layer in self.layers:
                hidden = layer(hidden, None, mask, position_ids=position_ids)
            return hidden
        position_embeddings = self.rotary(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids)
        return hidden


class HeadModule(nn.Module):
    """Token (+ GPT-2's learned position) embeddings: input ids [B,T] -> hidden [B,T,H]."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding | None,
                 dropout: nn.Module | None) -> None:
        super().__init__()
        self.tokens = tokens
        self.positions = positions
        self.dropout = dropout

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(input_ids)
        if self.positions is not None:
            hidden = hidden + self.positions(_positions(input_ids))
        return self.dropout(hidden) if self.dropout is not None else hidden


class TailModule(nn.Module):
    """Final norm, LM head and the mean next-token cross-entropy of one microbatch."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear, vocab_size: int) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(hidden))
        return ForCausalLMLoss(logits, labels, self.vocab_size)


class DataHolderModule(nn.Module):
    """What a data holder trains: ``head`` and ``tail`` (GPT-2's wte is shared, counted once)."""

    def __init__(self, family: str, config: PretrainedConfig, head: HeadModule, tail: TailModule) -> None:
        super().__init__()
        self.family = family
        self.config = config
        self.head = head
        self.tail = tail


@dataclass
class ModelParts:
    """The data holder's module and the relay stages' modules, in pipeline order."""

    data_holder: DataHolderModule
    stages: list[StageModule]
    partition: tuple[int, ...]

    def groups(self) -> list[list[nn.Parameter]]:
        """Parameter groups that step independently: [data holder, stage 1, ..., stage S]."""
        return [list(self.data_holder.parameters())] + [list(s.parameters()) for s in self.stages]


def split_model(model: PreTrainedModel, n_stages: int, partition: Sequence[int] = ()) -> ModelParts:
    """Cut ``model`` (GPT2LMHeadModel or LlamaForCausalLM) into parts sharing its Parameters.

    ``partition`` gives each stage's layer count explicitly; empty means balanced.
    """
    config = model.config
    family = "gpt2" if config.model_type == "gpt2" else "llama"
    if family == "gpt2":
        body = model.transformer
        layers, rotary = list(body.h), None
        head = HeadModule(body.wte, body.wpe, body.drop)
        tail = TailModule(body.ln_f, model.lm_head, config.vocab_size)
    else:
        body = model.model
        layers, rotary = list(body.layers), body.rotary_emb
        head = HeadModule(body.embed_tokens, None, None)
        tail = TailModule(body.norm, model.lm_head, config.vocab_size)
    counts = resolve_partition(len(layers), n_stages, partition)
    stages, first = [], 0
    for n in counts:
        stages.append(StageModule(family, config, layers[first:first + n], rotary, first))
        first += n
    return ModelParts(DataHolderModule(family, config, head, tail), stages, counts)
