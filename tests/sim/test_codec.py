"""The simulator's transfer sizes follow the wire codec (``Scenario.codec``), and it changes what it predicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gwtfp2p.config import ConfigError, encoded_bytes
from gwtfp2p.sim.compute import get_model
from gwtfp2p.sim.network import NetworkSpec
from gwtfp2p.sim.scenarios import get_scenario
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(240)


def test_sizes_follow_the_codec():
    model = get_model("llama500m")
    values = model.tokens * model.d_model
    assert model.activation_bytes == 2 * values  # none: bf16 as the GPUs compute
    for codec in ("float16", "bfloat16", "blockwise8"):
        coded = replace(model, codec=codec)
        assert coded.activation_bytes == encoded_bytes(codec, values, 2)
        assert coded.grad_bytes(1000) == encoded_bytes(codec, 1000, 2)
    assert replace(model, codec="blockwise8").activation_bytes < 0.52 * model.activation_bytes
    with pytest.raises(ConfigError, match="--codec"):
        replace(get_scenario("home-het-c16-llama500m"), codec="int4")


def test_eight_bit_activations_train_faster_on_home_uplinks():
    """Behind home uplinks (20-100 Mbit/s) bytes cost time: the same small seeded swarm (3 stages x 4
    relays, llama500m) trains its microbatches sooner with blockwise8 than with bf16 on the wire."""
    base = small(network=NetworkSpec("home"), target_microbatches=200)
    done = {}
    for codec in ("none", "blockwise8"):
        summary = Simulation(replace(base, codec=codec), seed=1, router="gwtf").run().summary
        assert summary.completed >= 200
        done[codec] = summary.time_to_n_s
    assert done["blockwise8"] < 0.9 * done["none"], done
