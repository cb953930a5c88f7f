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


@pytest.fixture(scope="session")
def minilm_2l(tmp_path_factory) -> str:
    """The bundled MiniLM cut to its first 2 layers: a real pretrained encoder (12 heads) that
    fine-tunes quickly on 2 cores. Saved once per session; tests copy it before changing anything."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from core.assets import teacher_path

    hf_logging.set_verbosity_error()
    path = teacher_path("minilm-l6")
    out = tmp_path_factory.mktemp("minilm-2l")
    AutoModel.from_pretrained(path, num_hidden_layers=2).save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return str(out)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    """A private KDNAS_CACHE so tests never read targets written by another run."""
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path / "kdnas-cache"))
    return tmp_path / "kdnas-cache"
