"""`kdnas evaluate --baselines`: a distilled student beside its two untrained baselines, rebuilt from
its distill.json, and the verdict — through the console entry point, on a real distilled student."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import pytest

import kdnas.cli


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A 2x12x384x256 student inherited from the bundled MiniLM, 2 steps of the final recipe's loss."""
    root = tmp_path_factory.mktemp("evaluate-baselines")
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stderr(io.StringIO()) as err:
        env.setenv("KDNAS_CACHE", str(root / "cache"))
        assert kdnas.cli.main(["distill", "--arch", "2x12x384x256", "--method", "embed", "--steps", "2",
                               "--batch-size", "8", "--seq-len", "32", "--unit", "sentence", "--train-size", "32",
                               "--eval-size", "8", "--out", str(root / "student")]) == 0
    # kdnas distill names the command that tells whether the student is any good
    assert f"kdnas evaluate {root / 'student'} --baselines --measures fidelity,probe" in err.getvalue()
    return root / "student"


def _evaluate(*args: str) -> int:
    return kdnas.cli.main(["evaluate", *args, "--tasks", "topic", "--max-len", "16", "--fidelity-sentences", "200",
                           "--fidelity-pairs", "500", "--draws", "2", "--no-latency"])


def test_a_student_is_judged_against_its_own_untrained_baselines(student, tmp_path, isolated_cache, capsys,
                                                                  minilm_2l):
    folder = tmp_path / "student"
    shutil.copytree(student, folder)
    record = json.loads((folder / "distill.json").read_text())
    assert record["teacher"] == "minilm-l6" and record["corpus"] == "news"
    assert record["transfer_set"]["unit"] == "sentence" and record["transfer_set"]["seq_len"] == 32

    assert _evaluate(str(folder), "--baselines", "--measures", "fidelity,probe", "--card",
                     "--out", str(tmp_path / "eval.json")) == 0
    out, err = capsys.readouterr()
    assert f"{folder}: building its untrained baselines from minilm-l6" in err
    report = json.loads((tmp_path / "eval.json").read_text())
    assert [(m["model"], m["role"]) for m in report["models"]] == [
        ("minilm-l6", "teacher"), (str(folder), "student"), ("first layer (untrained)", "baseline"),
        ("inherited 2x12x384x256 (untrained)", "baseline")]
    verdict = report["verdicts"][str(folder)]
    assert verdict["baselines"] == ["first layer (untrained)", "inherited 2x12x384x256 (untrained)"]
    assert verdict["comparisons"] == 6  # fidelity, full probe, 16-shot against each baseline
    assert verdict["start"].startswith("the inherited baseline is this student's own start (teacher layers [1, 6])")
    assert f"{folder}: ahead of both untrained baselines on every measure: " in out
    assert "first layer (untrained)" in out and "inherited 2x12x384x256 (untrained)" in out
    card = (folder / "README.md").read_text()
    assert "Against its untrained baselines (`--baselines`)" in card and "| inherited 2x12x384x256 (untrained) |" in card
    # kept as sentence-transformers folders in the cache: a rerun builds nothing and reads its scores
    kept = sorted(p.name for p in (isolated_cache / "baselines").glob("*/*") if p.is_dir())
    assert kept == ["first-layer", "inherited-2x12x384x256"]
    assert all((p / "modules.json").is_file() for p in (isolated_cache / "baselines").glob("*/*") if p.is_dir())
    # ... also when compared with another teacher: the baselines are cut from the one it was distilled from
    assert _evaluate(str(folder), "--baselines", "--measures", "fidelity", "--teacher", minilm_2l) == 0
    out, err = capsys.readouterr()
    assert "building" not in err and "majority class" not in out  # no classes without a probe or fine-tuning
    assert f"its baselines are cut from the teacher it was distilled from, minilm-l6 (its distill.json), not " \
           f"{minilm_2l}" in err


def test_baselines_refuse_what_cannot_rebuild_before_any_work(student, tmp_path, isolated_cache, capsys):
    def refused(*args: str) -> str:
        assert _evaluate(*args, "--baselines", "--out", str(tmp_path / "eval.json")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    assert "no MODEL has one (minilm-l6)" in refused("minilm-l6")
    legacy = tmp_path / "legacy"
    shutil.copytree(student, legacy)
    record = json.loads((legacy / "distill.json").read_text())
    (legacy / "distill.json").write_text(json.dumps({**record, "transfer_set": "0123456789abcdef"}))
    line = refused(str(legacy))
    assert str(legacy / "distill.json") in line and "does not describe its transfer set" in line
    (legacy / "distill.json").write_text("{not json")
    assert "cannot be read as JSON" in refused(str(legacy))
    (legacy / "distill.json").write_text("[]")
    assert "has no student spec and config" in refused(str(legacy))
    assert not (tmp_path / "eval.json").exists() and not (isolated_cache / "baselines").exists()


def test_a_damaged_baselines_folder_is_named_not_taken_for_baselines(student, tmp_path):
    from kdnas.core.errors import AssetError
    from kdnas.evaluation.baselines import build_baselines

    def build():
        return build_baselines(str(student), None, "news", 16, lambda line: None, tmp_path)

    built = build()  # the first build renames a whole folder into place; a second reads it
    assert [r.name for r in built.refs] == ["first layer (untrained)", "inherited 2x12x384x256 (untrained)"]
    assert [r.path for r in build().refs] == [r.path for r in built.refs]
    where = tmp_path / built.refs[0].path.split("/")[-2]
    shutil.rmtree(where)
    (where / "first-layer").mkdir(parents=True)  # what a hand (not a build) may leave: no model in it
    message = f"the baselines' folder {where} holds no complete model; remove it"
    with pytest.raises(AssetError, match=re.escape(message)):
        build()
    assert [p.name for p in tmp_path.iterdir()] == [where.name]  # the new build's stage is gone
