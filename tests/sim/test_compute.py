"""Compute model: parameter counts, FLOPs per microbatch, memory slots, presets and validation."""

from __future__ import annotations

import pytest

from gwtfp2p.config import ConfigError
from gwtfp2p.sim.compute import (
    GIB,
    GPUS,
    MODELS,
    get_gpu,
    get_model,
    holder_compute,
    relay_compute,
    stage_param_count,
)

pytestmark = pytest.mark.timeout(30)


def test_presets_have_the_advertised_sizes():
    llama, gpt = MODELS["llama500m"], MODELS["gpt1.3b"]
    assert (llama.d_model, llama.seq_len, llama.microbatch) == (1024, 1024, 4)
    assert 450e6 < llama.total_params < 600e6
    assert 1.2e9 < gpt.total_params < 1.45e9
    assert llama.activation_bytes == 4 * 1024 * 1024 * 2


def test_forward_and_backward_time_follow_the_flop_count():
    llama, gpu = MODELS["llama500m"], GPUS["rtx3090"]
    compute = relay_compute(llama, 6, gpu)
    flops = 6 * (2 * llama.layer_params * llama.tokens + 4 * llama.seq_len * llama.d_model * llama.tokens)
    assert compute.forward_s == pytest.approx(flops / (gpu.tflops * 1e12))
    assert compute.backward_s == pytest.approx(2 * compute.forward_s)
    assert relay_compute(llama, 6, gpu, slowdown=1.5).forward_s == pytest.approx(1.5 * compute.forward_s)


def test_memory_bounds_the_slots():
    llama = MODELS["llama500m"]
    small, big = relay_compute(llama, 6, GPUS["t4"]), relay_compute(llama, 6, GPUS["a100"])
    assert 1 <= small.slots < big.slots
    per_microbatch = llama.activation_memory_bytes(6)
    static = 16 * 6 * llama.layer_params
    assert small.slots == int((16 * GIB * 0.9 - static) // per_microbatch)


def test_stage_split_and_parameter_counts():
    llama = MODELS["llama500m"]
    assert llama.stage_layers(6) == (6,) * 6
    assert MODELS["gpt1.3b"].stage_layers(5) == (5, 5, 5, 5, 4)
    assert sum(stage_param_count(llama, s, 6) for s in range(7)) == llama.total_params
    assert holder_compute(llama, GPUS["a100"]).slots > 1000


def test_unknown_names_and_bad_splits_name_the_flag():
    with pytest.raises(ConfigError, match="--model"):
        get_model("gpt5")
    with pytest.raises(ConfigError, match="--gpu"):
        get_gpu("h9000")
    with pytest.raises(ConfigError, match="--stages"):
        MODELS["gpt1.3b"].stage_layers(25)
