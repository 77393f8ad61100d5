"""The default corpus is cached on disk: a cached read gives exactly the parsed documents, a changed
key (another interpreter or changed sources) parses again, and a corrupt cache file is ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtfp2p.model import corpus


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    corpus.default_corpus.cache_clear()
    yield tmp_path
    corpus.default_corpus.cache_clear()


def test_a_cached_corpus_equals_the_parsed_one(cache_home: Path) -> None:
    parsed = corpus.default_corpus()
    (cached_file,) = (cache_home / "gwtf").glob("corpus-*.json")
    corpus.default_corpus.cache_clear()
    assert corpus.default_corpus() == parsed and len(parsed) > 100
    cached_file.write_text("not json")  # a corrupt cache: parsed again, and rewritten
    corpus.default_corpus.cache_clear()
    assert corpus.default_corpus() == parsed
    assert corpus._cached(cached_file) == parsed


def test_the_key_follows_the_sources(cache_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text('"""A module docstring long enough to be kept in the corpus, surely."""\n')
    key = corpus._cache_path([(source, "mod")])
    source.write_text('"""Another module docstring long enough to be kept in the corpus, surely!"""\n')
    assert corpus._cache_path([(source, "mod")]) != key
