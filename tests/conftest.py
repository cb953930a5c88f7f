"""Shared fixtures: the real bundled teacher and corpus, loaded once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def teacher():
    from distill import load_teacher

    return load_teacher("minilm-l6")


@pytest.fixture(scope="session")
def news_texts():
    from distill import load_corpus

    return load_corpus("news")


@pytest.fixture(scope="session")
def small_data(teacher, news_texts):
    from distill import make_transfer_set

    return make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=128, num_eval=32, seed=0)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    """A private KDNAS_CACHE so tests never read targets written by another run."""
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path / "kdnas-cache"))
    return tmp_path / "kdnas-cache"
