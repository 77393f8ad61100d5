"""The last few optimizer steps of a part, kept so that a joining replica can replay them.

A replica records, for each step it takes, the iteration, the mean gradient it applied (on the
CPU), the microbatch count and the state hash after the step. A newcomer whose downloaded state
fell behind while it was downloading (the stage stepped meanwhile) fetches the missing steps and
applies them with ``Trainable.apply_mean``: the same arithmetic as the replicas, so the same bits,
checked against each step's hash. Owns the log and its wire format (peers are untrusted), no I/O.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

import torch

FORMAT = 1
MAX_HEADER_BYTES = 1 << 16
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class StepLogError(ValueError):
    """Replay bytes that are malformed, truncated or inconsistent."""


@dataclass(frozen=True)
class LoggedStep:
    iteration: int  # the iteration whose step this is: the state after it holds iteration + 1 steps
    mean_grad: torch.Tensor  # 1-D, CPU
    count: int
    state_hash: str  # after the step


class StepLog:
    """A ring of the last ``capacity`` steps (``capacity`` 0: none kept)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._steps: deque[LoggedStep] = deque(maxlen=max(capacity, 1))

    def record(self, iteration: int, mean_grad: torch.Tensor, count: int, state_hash: str) -> None:
        if self.capacity <= 0:
            return
        if self._steps and self._steps[-1].iteration != iteration - 1:
            self._steps.clear()  # a gap (we rejoined): older steps cannot be replayed in a row
        self._steps.append(LoggedStep(iteration, mean_grad.detach().to("cpu"), count, state_hash))

    def since(self, iteration: int) -> list[LoggedStep] | None:
        """The steps of iterations ``iteration``, ``iteration + 1``, … up to the latest; None if some
        of them are no longer (or not) kept. An empty list: nothing to replay."""
        if self.capacity <= 0 or not self._steps:
            return None
        if iteration == self._steps[-1].iteration + 1:
            return []
        first = self._steps[0].iteration
        if iteration < first or iteration > self._steps[-1].iteration:
            return None
        return list(self._steps)[iteration - first:]


def encode_steps(steps: list[LoggedStep]) -> bytes:
    """One JSON header line (per step: iteration, count, hash, numel, dtype), then the raw tensors."""
    header = {"format": FORMAT, "steps": [
        {"iteration": s.iteration, "count": s.count, "hash": s.state_hash, "numel": s.mean_grad.numel(),
         "dtype": str(s.mean_grad.dtype).removeprefix("torch.")} for s in steps]}
    parts = [json.dumps(header, sort_keys=True).encode() + b"\n"]
    parts += [s.mean_grad.contiguous().view(torch.uint8).numpy().tobytes() for s in steps]
    return b"".join(parts)


def decode_steps(data: bytes, *, first_iteration: int, numel: int) -> list[LoggedStep]:
    """Parse replay bytes from a peer: contiguous iterations from ``first_iteration``, ``numel`` each."""
    end = data.find(b"\n", 0, MAX_HEADER_BYTES)
    if end < 0:
        raise StepLogError("replay bytes without a header line")
    try:
        header = json.loads(data[:end])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise StepLogError(f"replay header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or not isinstance(header.get("steps"), list):
        raise StepLogError("replay header of an unknown format")
    steps, offset = [], end + 1
    for k, entry in enumerate(header["steps"]):
        step, offset = _decode_step(data, offset, entry, first_iteration + k, numel)
        steps.append(step)
    if offset != len(data):
        raise StepLogError(f"replay bytes: {len(data) - offset} trailing bytes")
    return steps


def _decode_step(data: bytes, offset: int, entry: object, iteration: int, numel: int) -> tuple[LoggedStep, int]:
    if not isinstance(entry, dict):
        raise StepLogError("replay step is not an object")
    name = entry.get("dtype")
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    count, digest = entry.get("count"), entry.get("hash")
    if entry.get("iteration") != iteration or entry.get("numel") != numel or dtype is None:
        raise StepLogError(f"replay step {entry.get('iteration')!r}: wanted iteration {iteration}, numel {numel}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or not isinstance(digest, str):
        raise StepLogError(f"replay step {iteration}: bad count or hash")
    size = numel * torch.empty(0, dtype=dtype).element_size()
    if offset + size > len(data):
        raise StepLogError(f"replay step {iteration}: truncated")
    grad = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=dtype)
    return LoggedStep(iteration, grad, count, digest), offset + size
