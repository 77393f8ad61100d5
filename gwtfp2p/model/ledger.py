"""Per-iteration microbatch bookkeeping shared by the executors, and saved-activation metering.

Owns: which microbatch ids await backward (with what autograd saved for them), which are done
(with the result to resend on a duplicate), and how many bytes of activations are held now and at
peak. It also derives the per-(microbatch, stage) dropout seed. It runs no model code.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class UnknownMicrobatch(KeyError):
    """Backward (or a lookup) for a microbatch id whose forward state this replica does not hold."""


def dropout_seed(run_seed: int, microbatch_id: str, part: str) -> int:
    """A 63-bit seed for one (microbatch, part) forward: same inputs, same dropout mask everywhere."""
    raw = hashlib.blake2b(f"{run_seed}|{microbatch_id}|{part}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big") >> 1


@contextlib.contextmanager
def seeded_rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """Fork the RNG of ``device`` (and the CPU) and seed it; a no-op when ``seed`` is None."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        yield


@dataclass
class Pending:
    """What one microbatch's forward left for its backward."""

    inputs: Any
    output: torch.Tensor
    saved_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)


class Ledger:
    """Pending and finished microbatches of the current iteration, and activation memory."""

    def __init__(self, module: nn.Module) -> None:
        self._param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.pending: dict[str, Pending] = {}
        self.done: dict[str, Any] = {}
        self.saved_bytes = 0
        self.peak_saved_bytes = 0
        self.max_microbatch_bytes = 0

    @contextlib.contextmanager
    def metering(self, sink: list[int]) -> Iterator[None]:
        """Count the bytes of distinct non-parameter storages autograd saves inside the block."""
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._param_storages and ptr not in seen:
                seen.add(ptr)
                sink[0] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def add_pending(self, mb_id: str, entry: Pending) -> None:
        """Record a forward's state (replacing, and freeing, an earlier one of the same id)."""
        self.free(mb_id)
        self.pending[mb_id] = entry
        self.saved_bytes += entry.saved_bytes
        self.peak_saved_bytes = max(self.peak_saved_bytes, self.saved_bytes)
        self.max_microbatch_bytes = max(self.max_microbatch_bytes, entry.saved_bytes)

    def peek(self, mb_id: str) -> Pending:
        """The pending forward state of ``mb_id`` (kept), or raise ``UnknownMicrobatch``."""
        entry = self.pending.get(mb_id)
        if entry is None:
            raise UnknownMicrobatch(mb_id)
        return entry

    def take(self, mb_id: str) -> Pending:
        """Remove and return a pending forward state, or raise ``UnknownMicrobatch``."""
        entry = self.pending.pop(mb_id, None)
        if entry is None:
            raise UnknownMicrobatch(mb_id)
        self.saved_bytes -= entry.saved_bytes
        return entry

    def free(self, mb_id: str) -> bool:
        """Drop a pending forward state if held; True if something was dropped."""
        entry = self.pending.pop(mb_id, None)
        if entry is None:
            return False
        self.saved_bytes -= entry.saved_bytes
        return True

    def end_iteration(self) -> int:
        """Forget everything of the iteration; returns how many forwards never got their backward."""
        dropped = len(self.pending)
        self.pending.clear()
        self.done.clear()
        self.saved_bytes = 0
        return dropped

    def status(self, mb_id: str) -> str:
        """``"done"`` (backward counted), ``"pending"`` (awaiting backward) or ``"unknown"``."""
        if mb_id in self.done:
            return "done"
        return "pending" if mb_id in self.pending else "unknown"
