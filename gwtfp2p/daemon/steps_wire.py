"""A replica's last optimizer steps as bytes: what a joiner downloads to replay (``aggregation/steplog.py``).

One JSON header line (per step: iteration, count, state hash, numel, dtype, the whole model's squared norm
it clipped by), then the raw mean gradients. The decoder checks every field against what the joiner asked
for and raises ``wire.WireError`` with the reason (the bytes come from an untrusted peer).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from gwtfp2p.daemon.wire import WireError

MAX_STEPS_HEADER_BYTES, STEPS_FORMAT = 1 << 16, 1


STEP_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "float64": torch.float64}


@dataclass(frozen=True)
class LoggedStep:
    iteration: int  # the iteration whose step this is: the state after it holds iteration + 1 steps
    mean_grad: torch.Tensor  # 1-D, CPU
    count: int
    state_hash: str  # after the step
    total_sq_norm: float | None = None  # the whole model's squared norm it clipped by (None: per-part clipping)


def encode_steps(steps: list[LoggedStep]) -> bytes:
    """One JSON header line (per step: iteration, count, hash, numel, dtype, the total squared norm it
    clipped by: "nan" if not finite, JSON has no inf), then the raw tensors."""
    header = {"format": STEPS_FORMAT, "steps": [
        {"iteration": s.iteration, "count": s.count, "hash": s.state_hash, "numel": s.mean_grad.numel(),
         "dtype": str(s.mean_grad.dtype).removeprefix("torch."), "total_sq_norm": (
             s.total_sq_norm if s.total_sq_norm is None or math.isfinite(s.total_sq_norm) else "nan")}
        for s in steps]}
    parts = [json.dumps(header, sort_keys=True).encode() + b"\n"]
    parts += [s.mean_grad.contiguous().view(torch.uint8).numpy().tobytes() for s in steps]
    return b"".join(parts)


def _norm_of(value: object, iteration: int) -> float | None:
    if value is None or value == "nan":
        return None if value is None else math.nan
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise WireError(f"replay step {iteration}: bad total_sq_norm {value!r}")
    return float(value)


def decode_steps(data: bytes, *, first_iteration: int, numel: int) -> list[LoggedStep]:
    """Parse replay bytes from a peer: contiguous iterations from ``first_iteration``, ``numel`` each."""
    end = data.find(b"\n", 0, MAX_STEPS_HEADER_BYTES)
    if end < 0:
        raise WireError("replay bytes without a header line")
    try:
        header = json.loads(data[:end])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise WireError(f"replay header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("format") != STEPS_FORMAT or not isinstance(header.get("steps"),
                                                                                               list):
        raise WireError("replay header of an unknown format")
    steps, offset = [], end + 1
    for k, entry in enumerate(header["steps"]):
        step, offset = _decode_step(data, offset, entry, first_iteration + k, numel)
        steps.append(step)
    if offset != len(data):
        raise WireError(f"replay bytes: {len(data) - offset} trailing bytes")
    return steps


def _decode_step(data: bytes, offset: int, entry: object, iteration: int, numel: int) -> tuple[LoggedStep, int]:
    if not isinstance(entry, dict):
        raise WireError("replay step is not an object")
    name = entry.get("dtype")
    dtype = STEP_DTYPES.get(name) if isinstance(name, str) else None
    count, digest = entry.get("count"), entry.get("hash")
    if entry.get("iteration") != iteration or entry.get("numel") != numel or dtype is None:
        raise WireError(f"replay step {entry.get('iteration')!r}: wanted iteration {iteration}, numel {numel}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or not isinstance(digest, str):
        raise WireError(f"replay step {iteration}: bad count or hash")
    size = numel * torch.empty(0, dtype=dtype).element_size()
    if offset + size > len(data):
        raise WireError(f"replay step {iteration}: truncated")
    grad = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=dtype)
    return LoggedStep(iteration, grad, count, digest, _norm_of(entry.get("total_sq_norm"), iteration)), offset + size
