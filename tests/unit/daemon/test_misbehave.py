"""The hostile daemon's switches (tests only): off unless ``$GWTF_MISBEHAVE`` names them, unknown names rejected,
and a swallower claims a compute time faster than any honest one."""

from __future__ import annotations

import pytest
import torch

from gwtfp2p.daemon.testing import misbehave


def test_nothing_is_armed_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(misbehave.MISBEHAVE_ENV, raising=False)
    assert not misbehave.armed("swallow") and not misbehave.armed("corrupt")
    assert misbehave.claimed_compute_s(0.25) == 0.25
    output = torch.ones(2, 3)
    assert misbehave.corrupted(output) is output


def test_a_swallower_claims_a_fast_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(misbehave.MISBEHAVE_ENV, "swallow")
    assert misbehave.claimed_compute_s(0.25) == misbehave.SWALLOWER_CLAIMED_COMPUTE_S < 0.25
    assert torch.equal(misbehave.corrupted(torch.ones(2, 3)), torch.ones(2, 3))


def test_a_corrupter_adds_noise_of_its_outputs_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(misbehave.MISBEHAVE_ENV, " corrupt , ")
    output = torch.ones(4, 8)
    noisy = misbehave.corrupted(output)
    assert not torch.equal(noisy, output) and misbehave.claimed_compute_s(0.25) == 0.25


def test_an_unknown_behaviour_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(misbehave.MISBEHAVE_ENV, "swallow,explode")
    with pytest.raises(ValueError, match="explode"):
        misbehave.armed("swallow")
