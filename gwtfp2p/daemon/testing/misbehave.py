"""Test tooling: a hostile volunteer's modified daemon, armed by ``$GWTF_MISBEHAVE`` only.

The adversarial suite (``tests/adversarial``) runs real ``gwtf join`` processes that misbehave as a
volunteer with a modified daemon could: ``swallow`` (acknowledge forwards and never compute them: a
relay that takes work and delivers nothing, answering every ping, and claiming a fast GPU to draw the
work), ``corrupt`` (add noise to every output this node computes: its forwards and its answers to
cross-checks). Comma-separated; off by default, and no CLI flag arms it.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)
MISBEHAVE_ENV = "GWTF_MISBEHAVE"
BEHAVIOURS = ("swallow", "corrupt")
SWALLOWER_CLAIMED_COMPUTE_S = 0.001  # what a swallower claims per microbatch: cheaper than any honest GPU


def armed(behaviour: str) -> bool:
    """Whether this daemon plays ``behaviour`` (read from the environment every time: tests only)."""
    wanted = {b.strip() for b in os.environ.get(MISBEHAVE_ENV, "").split(",") if b.strip()}
    unknown = wanted - set(BEHAVIOURS)
    if unknown:
        raise ValueError(f"${MISBEHAVE_ENV}: unknown behaviours {sorted(unknown)}; known: {', '.join(BEHAVIOURS)}")
    return behaviour in wanted


def corrupted(output: torch.Tensor) -> torch.Tensor:
    """``output`` as a ``corrupt`` daemon sends it: plus noise of its own scale (else unchanged)."""
    if not armed("corrupt") or not output.is_floating_point():
        return output
    noise = torch.randn(output.shape, generator=torch.Generator().manual_seed(7), dtype=output.dtype)
    return output + noise * (output.abs().mean() + 1e-3)


def claimed_compute_s(measured_s: float) -> float:
    """The compute time this daemon announces: a ``swallow`` daemon claims a GPU faster than any honest one,
    so the flow routes work to it whatever its own start-up estimate was (else unchanged)."""
    return SWALLOWER_CLAIMED_COMPUTE_S if armed("swallow") else measured_s
