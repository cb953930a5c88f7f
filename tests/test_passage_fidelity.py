"""benchmarks/passage_fidelity.py: the held-out passages it scores fidelity on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from passage_fidelity import MAX_WORDS, MIN_WORDS, PER_DOCUMENT, heldout_passages  # noqa: E402

from kdnas.distill.data import is_heldout  # noqa: E402


def _corpus(n: int = 400) -> list[str]:
    # Documents of 40 sentences of 7-15 words each, every one distinct.
    return [" ".join(f"Doc{d} sentence {s} " + "word " * (s % 9 + 4) + "end." for s in range(40)) for d in range(n)]


def test_passages_are_whole_sentence_runs_of_held_out_documents_within_bounds():
    docs = _corpus()
    held = [d for d in docs if is_heldout(d)]
    assert held and len(held) < len(docs)
    passages = heldout_passages(docs, n=10_000)
    assert passages
    for p in passages:
        assert MIN_WORDS <= len(p.split()) <= MAX_WORDS
        owner = p.split()[0]
        assert any(d.startswith(owner + " ") for d in held)  # from a held-out document only
        assert p.endswith("end.") and p in next(d for d in held if d.startswith(owner + " "))
    per_doc = {}
    for p in passages:
        per_doc[p.split()[0]] = per_doc.get(p.split()[0], 0) + 1
    assert max(per_doc.values()) <= PER_DOCUMENT
    assert max(per_doc.values()) > 1  # several per document, so far more than one per held-out document


def test_passages_are_seeded_and_capped():
    docs = _corpus()
    assert heldout_passages(docs, n=50) == heldout_passages(docs, n=50)
    assert heldout_passages(docs, n=50, seed=1) != heldout_passages(docs, n=50)
    assert len(heldout_passages(docs, n=7)) == 7


def test_a_folder_that_is_no_student_is_refused_in_one_line(tmp_path, capsys):
    from student_quality import build_baselines

    with pytest.raises(SystemExit) as stop:
        build_baselines(tmp_path, "minilm-l6", "news", tmp_path / "work")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no distill.json" in err and str(tmp_path) in err
    assert not (tmp_path / "work").exists()  # nothing written


def test_every_student_folder_is_checked_before_any_work(tmp_path, capsys, monkeypatch):
    import passage_fidelity

    student = tmp_path / "student"
    student.mkdir()
    (student / "distill.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["passage_fidelity.py", str(student), str(tmp_path / "typo"),
                                      "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out.json")])
    with pytest.raises(SystemExit) as stop:
        passage_fidelity.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "typo" in err and "has no distill.json" in err
    assert not (tmp_path / "work").exists() and not (tmp_path / "out.json").exists()
