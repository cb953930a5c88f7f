"""benchmarks/fit_gap.py: the two samples it reads a student's fidelity on."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fit_gap import samples  # noqa: E402

from kdnas.distill import make_transfer_set  # noqa: E402
from kdnas.distill.data import heldout_sentences  # noqa: E402


def test_one_sample_is_rows_trained_on_and_the_other_held_out_text_of_the_same_form(teacher, news_texts):
    tokenizer = teacher.tokenizer
    data = make_transfer_set(tokenizer, news_texts, seq_len=32, num_train=64, num_eval=8, seed=0, unit="sentence")
    setup = SimpleNamespace(teacher=teacher, data=data, sentences=heldout_sentences(news_texts, 40))
    texts = samples(setup, rows=20)
    assert len(texts["trained_on"]) == len(texts["held_out"]) == 20
    assert samples(setup, rows=20) == texts  # seeded

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, truncation=True, max_length=32)["input_ids"])

    trained = {tuple(row[mask.bool()].tolist()) for row, mask in zip(data.train_ids, data.train_mask)}
    # Decoded rows of the transfer set: nearly all encode back to their row (a row cut inside a word may not).
    assert sum(encode(t) in trained for t in texts["trained_on"]) >= 18
    # Held-out sentences: cut to the rows' length, none of them a training row.
    assert all(len(tokenizer(t)["input_ids"]) <= 32 and encode(t) not in trained for t in texts["held_out"])
