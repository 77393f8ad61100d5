"""Presets, seeded building and the head / stages / tail split."""

from __future__ import annotations

import pytest
import torch

from gwtfp2p.config import ConfigError
from gwtfp2p.model.build import build_from_spec, build_model
from gwtfp2p.model.partition import balanced_partition, resolve_partition, split_model
from gwtfp2p.model.presets import PRESETS, count_parameters, get_preset, model_config
from tests.unit.model.tiny import VOCAB, tiny_spec


def test_every_preset_makes_a_config_and_sizes_grow():
    for family, table in PRESETS.items():
        counts = [count_parameters(family, name) for name in table]
        assert counts == sorted(counts), family
        assert 100e6 < count_parameters(family, "124m") < 170e6
        assert 450e6 < count_parameters(family, "500m") < 650e6
        for name in table:
            assert model_config(family, name, VOCAB).vocab_size == VOCAB


def test_unknown_preset_and_family_name_the_flag():
    with pytest.raises(ConfigError, match="--model-preset"):
        get_preset("gpt2", "huge")
    with pytest.raises(ConfigError, match="--model-family"):
        get_preset("bert", "tiny")
    with pytest.raises(ConfigError, match="--seq-len"):
        build_from_spec(tiny_spec(seq_len=10_000), VOCAB)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_build_is_seeded_and_leaves_the_global_rng_alone(family):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(family, "tiny", VOCAB, seed=5)
    after = torch.rand(1)
    b = build_model(family, "tiny", VOCAB, seed=5)
    c = build_model(family, "tiny", VOCAB, seed=6)
    assert torch.equal(before, after)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))


def test_partitions_balanced_and_explicit():
    assert balanced_partition(4, 1) == (4,)
    assert balanced_partition(5, 2) == (3, 2)
    assert balanced_partition(12, 5) == (3, 3, 2, 2, 2)
    assert resolve_partition(4, 2, (1, 3)) == (1, 3)
    with pytest.raises(ConfigError, match="--partition"):
        resolve_partition(4, 2, (2, 3))
    with pytest.raises(ConfigError, match="--stages"):
        balanced_partition(4, 5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("partition", [(4,), (2, 2), (1, 3), (1, 1, 1, 1)])
def test_split_forward_is_bitwise_the_unsplit_loss(family, partition):
    model = build_model(family, "tiny", VOCAB, seed=1)
    parts = split_model(model, len(partition), partition)
    assert [len(s.layers) for s in parts.stages] == list(partition)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    hidden = parts.data_holder.head(ids)
    for stage in parts.stages:
        hidden = stage(hidden)
    loss = parts.data_holder.tail(hidden, ids)
    expected = model(input_ids=ids, labels=ids, use_cache=False).loss
    assert torch.equal(loss, expected)


def test_parts_cover_every_parameter_once_and_gpt2_ties_wte():
    model = build_model("gpt2", "tiny", VOCAB, seed=1)
    parts = split_model(model, 2)
    ids = [id(p) for group in parts.groups() for p in group]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    dh = parts.data_holder
    assert dh.head.tokens.weight is dh.tail.lm_head.weight
    llama = split_model(build_model("llama", "tiny", VOCAB, seed=1), 2).data_holder
    assert llama.head.tokens.weight is not llama.tail.lm_head.weight
