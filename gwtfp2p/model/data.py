"""Training data: documents via the ``datasets`` library, one token stream, seeded microbatches.

Owns reading a run's ``dataset`` (empty: the embedded default corpus; a local ``.txt``/``.json``/
``.jsonl``/``.parquet`` file or glob; otherwise a hub dataset name, where the machine can reach
the hub), joining documents into one token stream with end-of-document ids, and the sampler that
makes microbatch ``index`` of ``iteration`` for data-holder shard ``shard`` from the run seed
alone, so any microbatch can be rebuilt anywhere without state.
"""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

import datasets
import torch

from gwtfp2p.config import ConfigError, RunSpec
from gwtfp2p.model.corpus import default_corpus
from gwtfp2p.model.tokenizer import Tokenizer

_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_documents(dataset: str, *, split: str = "train", text_column: str = "text",
                   cache_dir: str | None = None) -> datasets.Dataset:
    """The run's documents as a ``datasets.Dataset`` with one string column ``text``.

    ``cache_dir`` is where ``datasets`` keeps its Arrow cache (default: its usual cache).
    """
    if not dataset:
        return datasets.Dataset.from_dict({"text": list(default_corpus())})
    files = sorted(glob.glob(dataset)) if any(c in dataset for c in "*?[") else [dataset]
    local = [f for f in files if Path(f).is_file()]
    try:
        if local:
            builders = {_BUILDERS.get(Path(f).suffix.lower()) for f in local}
            if len(builders) != 1 or None in builders:
                raise ConfigError(f"--dataset: {dataset!r} must name .txt, .json(l) or .parquet files of "
                                  "one kind")
            ds = datasets.load_dataset(builders.pop(), data_files=local, split="train", cache_dir=cache_dir)
        else:
            ds = datasets.load_dataset(dataset, split=split, cache_dir=cache_dir)
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many types (offline, missing, malformed)
        raise ConfigError(f"--dataset: cannot load {dataset!r} ({type(exc).__name__}: {exc}); give a local "
                          "file or leave it empty for the embedded corpus") from exc
    if text_column not in ds.column_names:
        raise ConfigError(f"--dataset: {dataset!r} has no {text_column!r} column "
                          f"(columns: {ds.column_names})")
    ds = ds.select_columns([text_column])
    return ds if text_column == "text" else ds.rename_column(text_column, "text")


def tokenize_documents(docs: datasets.Dataset, tokenizer: Tokenizer, *, max_tokens: int | None = None,
                       batch_docs: int = 256) -> torch.Tensor:
    """One int32 token stream: every document's tokens followed by the end-of-document id."""
    pieces: list[torch.Tensor] = []
    total = 0
    for start in range(0, len(docs), batch_docs):
        for text in docs[start:start + batch_docs]["text"]:
            if not text:
                continue
            ids = tokenizer.encode(text)
            ids.append(tokenizer.eos_id)
            pieces.append(torch.tensor(ids, dtype=torch.int32))
            total += len(ids)
            if max_tokens is not None and total >= max_tokens:
                return torch.cat(pieces)[:max_tokens]
    if not pieces:
        raise ConfigError("--dataset: the documents hold no text")
    return torch.cat(pieces)


def _seed(*parts: object) -> int:
    raw = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big") >> 1


class MicrobatchSampler:
    """Deterministic microbatches ([B,T] int64 windows) of one data holder's shard of a stream.

    Shard ``shard`` of ``n_shards`` is the contiguous ``shard``-th slice of the stream; window
    starts are drawn from a generator seeded by (seed, shard, iteration, index) alone.
    """

    def __init__(self, tokens: torch.Tensor, *, seq_len: int, microbatch_size: int, seed: int,
                 shard: int = 0, n_shards: int = 1) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} is not within 0..{n_shards - 1}")
        lo, hi = len(tokens) * shard // n_shards, len(tokens) * (shard + 1) // n_shards
        self.tokens = tokens[lo:hi]
        self.seq_len, self.microbatch_size = seq_len, microbatch_size
        self.seed, self.shard = seed, shard
        self.n_windows = len(self.tokens) - seq_len + 1
        if self.n_windows < 1:
            raise ConfigError(f"--seq-len: shard {shard} holds {len(self.tokens)} tokens, fewer than one "
                              f"sequence of {seq_len}; use more data or fewer data holders")

    def microbatch(self, iteration: int, index: int) -> torch.Tensor:
        """Microbatch ``index`` of ``iteration`` (same arguments, same tokens, on any machine)."""
        gen = torch.Generator().manual_seed(_seed(self.seed, self.shard, iteration, index))
        starts = torch.randint(0, self.n_windows, (self.microbatch_size,), generator=gen)
        offsets = starts.unsqueeze(1) + torch.arange(self.seq_len).unsqueeze(0)
        return self.tokens[offsets].long()

    def iteration(self, iteration: int, count: int) -> list[torch.Tensor]:
        """The first ``count`` microbatches of ``iteration``."""
        return [self.microbatch(iteration, i) for i in range(count)]


def sampler_for(spec: RunSpec, tokens: torch.Tensor, shard: int, n_shards: int) -> MicrobatchSampler:
    """The sampler of data holder ``shard`` for a run spec."""
    return MicrobatchSampler(tokens, seq_len=spec.seq_len, microbatch_size=spec.microbatch_size,
                             seed=spec.seed, shard=shard, n_shards=n_shards)
