"""benchmarks/other_text.py: the one other English corpus the pinned packages hold, as it reads it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from other_text import tweets  # noqa: E402


def test_tweets_are_the_pinned_file_without_links():
    texts = tweets()  # refuses a file whose sha256 is not the pinned one
    assert len(texts) == 63_034
    # links are gone; a retweet cut short may keep a bare "http:…" stub, which points nowhere
    assert not any(re.search(r"https?://\S", t) for t in texts)
    assert min(len(t.split()) for t in texts) >= 4
    assert len(set(texts)) > 0.9 * len(texts)  # distinct text, the point of the benchmark
