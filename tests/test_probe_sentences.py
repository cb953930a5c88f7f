"""The probe's held-out sentences: what a corpus too small for them is told, naming what needs them."""

from __future__ import annotations

import pytest

from kdnas.core.errors import InputError
from kdnas.nas.config import SearchConfig
from kdnas.nas.proxy import probe_sentences


def test_a_corpus_too_small_for_the_probe_is_refused_naming_what_needs_it_and_the_way_out(news_texts):
    small = news_texts[:24]  # fewer documents than held-out measures need
    with pytest.raises(InputError, match=r"24 documents.*the fidelity proxy.*--proxy hs"):
        probe_sentences(SearchConfig.from_flags(), small)
    # --proxy hs does without the probe, but precision plans (the default runtime) score graphs on it
    with pytest.raises(InputError, match=r"24 documents.*precision plans.*--runtime onnxruntime \("):
        probe_sentences(SearchConfig.from_flags(proxy="hs"), small)
    with pytest.raises(InputError, match=r"holds out \d+ sentences beyond the 100000.*precision plans need"):
        probe_sentences(SearchConfig.from_flags(proxy="hs", quality_sentences=100000), news_texts)
    assert len(probe_sentences(SearchConfig.from_flags(proxy="hs"), news_texts)) >= 2
