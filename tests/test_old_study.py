"""A study written by an earlier kdnas (tests/fixtures/study-v2: a finished search of schema version 2, made by
the code of its commit, its folder reduced to study.db) reports and resumes under this code; a study of a newer
record version is refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from kdnas.nas.schema import SCHEMA_VERSION, VERSION_ATTR

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "study-v2"
MADE_WITH = json.loads((FIXTURE / "made-with.json").read_text())  # the command and commit that made it


def kdnas(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})


def _copy(tmp_path: Path) -> tuple[Path, optuna.Study]:
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(FIXTURE / "study.db", out / "study.db")
    study = optuna.load_study(study_name="kdnas", storage=f"sqlite:///{out / 'study.db'}")
    return out, study


def test_an_earlier_study_reports_under_this_code(tmp_path):
    out, study = _copy(tmp_path)
    assert study.user_attrs[VERSION_ATTR] == 2 <= SCHEMA_VERSION
    done = kdnas("report", str(out), "--storage", f"sqlite:///{out / 'study.db'}", "--study-name", "kdnas")
    assert done.returncode == 0, done.stderr[-2000:]
    page = (out / "report.html").read_text()
    assert all(t.user_attrs["arch"] in page for t in study.trials if t.user_attrs.get("arch"))
    assert (out / "pareto.html").is_file()


@pytest.mark.slow  # a resumed search's final stage (about a minute on 2 cores)
def test_an_earlier_study_resumes_under_this_code(tmp_path):
    out, study = _copy(tmp_path)
    import torch

    from kdnas.distill.loop import resolve_precision
    from kdnas.nas.search import latency_machine

    # made on another host, it would be refused for its latencies (another CPU's) and, where this CPU has no bf16
    # arithmetic, for its training precision: as if made on this one
    settings = study.user_attrs["kdnas_settings"]
    runtime = settings["latency_machine"]["runtime"].split()[0]
    here = {"latency_machine": latency_machine(runtime), "dtype": resolve_precision("auto", torch.device("cpu"))}
    study.set_user_attr("kdnas_settings", {**settings, **here})
    trials = [(t.number, t.state, t.values, t.params) for t in study.trials]
    args = [a.replace("OUT", str(out)) for a in MADE_WITH["args"]]
    done = kdnas(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    after = optuna.load_study(study_name="kdnas", storage=f"sqlite:///{out / 'study.db'}")
    assert [(t.number, t.state, t.values, t.params) for t in after.trials] == trials  # nothing re-run
    assert (out / "best" / "model.onnx").is_file() and json.loads((out / "summary.json").read_text())["final"]


def test_a_study_of_a_newer_record_version_is_refused_in_one_line(tmp_path):
    out, study = _copy(tmp_path)
    study.set_user_attr(VERSION_ATTR, SCHEMA_VERSION + 1)
    done = kdnas("report", str(out), "--storage", f"sqlite:///{out / 'study.db'}", "--study-name", "kdnas")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"record version {SCHEMA_VERSION + 1}" in done.stderr and "upgrade kdnas" in done.stderr
