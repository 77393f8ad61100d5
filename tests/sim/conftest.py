"""Small seeded scenarios shared by the simulator tests (each runs in well under a second)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gwtfp2p.sim.network import NetworkSpec
from gwtfp2p.sim.params import DataPlaneParams, Scenario


def small(name: str = "small", **overrides) -> Scenario:
    """3 stages × 4 relays, 2 data holders × 6 microbatches, heterogeneous GPUs on geo10."""
    base = Scenario(name=name, n_stages=3, relays_per_stage=4, data_holders=2, microbatches_per_dh=6,
                    compute="heterogeneous", target_microbatches=600, horizon_s=4 * 3600.0)
    return replace(base, **overrides)


def ideal(**overrides) -> Scenario:
    """No latency, unlimited bandwidth, identical GPUs, one microbatch per relay per iteration."""
    base = small("ideal", network=NetworkSpec("ideal"), compute="homogeneous", data_holders=1,
                 microbatches_per_dh=4, max_slots=1, target_microbatches=800)
    return replace(base, **overrides)


@pytest.fixture
def refused() -> DataPlaneParams:
    return DataPlaneParams(crash_mode="refused")
