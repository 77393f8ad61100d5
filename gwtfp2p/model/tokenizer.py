"""Tokenizers: a byte-level one that needs no download, and a local transformers tokenizer.

Owns the ``Tokenizer`` interface the data path uses (vocabulary size, end-of-document id, encode,
decode) and ``load_tokenizer(name)``: ``"bytes"`` is UTF-8 bytes 0..255 plus id 256 as the
end-of-document marker (257 ids); anything else is a local directory holding a transformers
tokenizer (never fetched from the hub).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gwtfp2p.config import ConfigError, RunSpec


class Tokenizer(Protocol):
    """What the data path needs from a tokenizer."""

    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; id 256 ends a document."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (``local_files_only``)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError variants
            raise ConfigError(f"--tokenizer: cannot load a tokenizer from {path!r} ({exc}); use 'bytes' "
                              "or a local directory saved with save_pretrained") from exc
        self.vocab_size = len(self._tok)
        eos = self._tok.eos_token_id
        if eos is None:
            eos = self._tok.sep_token_id if self._tok.sep_token_id is not None else self._tok.pad_token_id
        if eos is None:
            raise ConfigError(f"--tokenizer: {path!r} defines no end-of-text token (eos, sep or pad)")
        self.eos_id = int(eos)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def run_vocab_size(spec: RunSpec) -> int:
    """The model vocabulary of a run: ``spec.vocab_size``, or 257 for the byte tokenizer."""
    if spec.vocab_size:
        return spec.vocab_size
    if spec.tokenizer == "bytes":
        return ByteTokenizer.vocab_size
    raise ConfigError("--vocab-size: is required with a transformers tokenizer")


def tokenizer_for(spec: RunSpec) -> Tokenizer:
    """The run's tokenizer, checked to fit the run's model vocabulary (data holders only)."""
    tokenizer = load_tokenizer(spec.tokenizer)
    if tokenizer.vocab_size > run_vocab_size(spec):
        raise ConfigError(f"--vocab-size: the tokenizer has {tokenizer.vocab_size} ids, more than the "
                          f"run's {run_vocab_size(spec)}")
    return tokenizer


def load_tokenizer(name: str) -> Tokenizer:
    """``"bytes"`` -> ``ByteTokenizer``; a local directory -> ``HFTokenizer``."""
    if name == "bytes":
        return ByteTokenizer()
    if not Path(name).is_dir():
        raise ConfigError(f"--tokenizer: {name!r} is neither 'bytes' nor a local tokenizer directory "
                          "(hub downloads are not used)")
    return HFTokenizer(name)
