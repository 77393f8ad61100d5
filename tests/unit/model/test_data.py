"""Data path: tokenizers, documents via datasets, the embedded corpus, deterministic sampling."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from gwtfp2p.config import ConfigError
from gwtfp2p.model.corpus import default_corpus
from gwtfp2p.model.data import MicrobatchSampler, load_documents, sampler_for, tokenize_documents
from gwtfp2p.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer, run_vocab_size, tokenizer_for
from tests.unit.model.tiny import tiny_spec


def test_byte_tokenizer_roundtrip():
    tok = load_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 257 and tok.eos_id == 256
    text = "héllo, wörld ✓"
    assert tok.decode(tok.encode(text)) == text
    assert max(tok.encode(text)) < 256


def test_local_transformers_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>", unk_token="[UNK]").save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 4 and tok.eos_id == 1
    assert tok.encode("hello world") == [2, 3]
    with pytest.raises(ConfigError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "missing"))
    spec = tiny_spec(tokenizer=str(tmp_path), vocab_size=8)  # the model may have spare ids
    assert run_vocab_size(spec) == 8 and tokenizer_for(spec).vocab_size == 4
    with pytest.raises(ConfigError, match="--vocab-size"):
        tokenizer_for(tiny_spec(tokenizer=str(tmp_path), vocab_size=3))
    assert run_vocab_size(tiny_spec()) == 257


def test_local_files_of_each_kind(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"content": t, "n": i})
                                                for i, t in enumerate(["alpha", "beta"])))
    datasets.Dataset.from_dict({"text": ["parquet one", "parquet two"]}).to_parquet(str(tmp_path / "c.parquet"))
    cache = str(tmp_path / "cache")
    assert load_documents(str(tmp_path / "a.txt"), cache_dir=cache)["text"] == ["first line", "second line"]
    assert load_documents(str(tmp_path / "b.jsonl"), text_column="content",
                          cache_dir=cache)["text"] == ["alpha", "beta"]
    assert load_documents(str(tmp_path / "*.parquet"), cache_dir=cache)["text"] == ["parquet one", "parquet two"]
    with pytest.raises(ConfigError, match="no 'text' column"):
        load_documents(str(tmp_path / "b.jsonl"), cache_dir=cache)
    with pytest.raises(ConfigError, match="one kind"):
        load_documents(str(tmp_path / "[ab].*"))


def test_default_corpus_is_offline_deterministic_and_sizeable():
    docs = default_corpus()
    assert len(docs) > 100 and sum(map(len, docs)) > 100_000
    ds = load_documents("")
    assert ds["text"][:3] == list(docs[:3])
    tokens = tokenize_documents(ds, ByteTokenizer(), max_tokens=50_000)
    assert tokens.shape == (50_000,) and tokens.dtype == torch.int32 and int(tokens.max()) <= 256
    assert (tokens == 256).any()  # documents are separated


def test_sampler_is_a_function_of_seed_shard_iteration_index():
    tokens = torch.arange(10_000, dtype=torch.int32)
    spec = tiny_spec(seq_len=16, microbatch_size=3, seed=9)
    s0, again, s1 = sampler_for(spec, tokens, 0, 2), sampler_for(spec, tokens, 0, 2), sampler_for(spec, tokens, 1, 2)
    mb = s0.microbatch(4, 2)
    assert mb.shape == (3, 16) and mb.dtype == torch.int64
    assert torch.equal(mb, again.microbatch(4, 2))
    assert not torch.equal(mb, s0.microbatch(5, 2)) and not torch.equal(mb, s0.microbatch(4, 3))
    assert torch.equal(mb[:, 1:] - mb[:, :-1], torch.ones(3, 15, dtype=torch.int64))  # contiguous windows
    assert int(mb.max()) < 5000 <= int(s1.microbatch(4, 2).min())  # shards are disjoint
    assert [len(b) for b in s0.iteration(0, 4)] == [3, 3, 3, 3]
    with pytest.raises(ConfigError, match="--seq-len"):
        MicrobatchSampler(tokens[:10], seq_len=16, microbatch_size=1, seed=0)
