"""`kdnas search` end to end on the real stack: SQLite storage, latency.profile, distill, export,
a headless Chromium for the report, and a SIGKILL in the middle of a trial.

Shapes and steps are tiny so the module runs in a few minutes on 2 shared cores; the default-size
search is measured by benchmarks/search_quality.py and the README.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from kdnas.nas import kdnas_reward
from kdnas.nas.measure import DRIFT_BAND
from kdnas.nas.schema import UNCOUNTED, Candidate, FinalTeacher, Quality, TeacherInt8

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
TINY = ["--proxy-eval", "8", "--seq-len", "32", "--final-train", "48",
        "--final-batch-size", "8", "--quality-sentences", "48", "--proxy-sentences", "60", "--no-progress"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def trained(out: Path) -> Path:
    """The trained student's folder of a search of one budget: `best/`, or where the teacher's own graph won the
    budget (it fits --budget-ms 1000 as fp32), `finalists/student-ARCH/` (nas.final._teacher)."""
    return Path(json.loads((out / "summary.json").read_text())["final"][0]["dir"])


def kdnas(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def load(out: Path, name: str = "kdnas") -> optuna.Study:
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}", engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.load_study(study_name=name, storage=storage)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def budget_ms() -> float:
    """Between the cheapest and the dearest shape of SEARCH, measured like the search does."""
    from kdnas.latency import profile

    cheap = profile("1x4x384x256", batch=1, seq=128, threads=2).median_ms
    dear = profile("6x4x384x1536", batch=1, seq=128, threads=2).median_ms
    assert dear > 4 * cheap, (cheap, dear)
    return round(math.sqrt(cheap * dear), 3)


@pytest.fixture(scope="module")
def search_run(tmp_path_factory, budget_ms):
    out = tmp_path_factory.mktemp("search") / "run"
    # Random sampler, seed 2: proposes 1x4x384x256 and 1x4x384x1536 (within the budget), 6x4x384x256
    # and 6x4x384x1536 (over it), and repeats a shape, so every path of a trial is taken. Shapes of
    # the teacher's width: a sub-millisecond graph reads noisy on a shared host, is measured five
    # times and never cached, which made this module minutes slower.
    args = ["search", "--out", str(out), "--trials", "6", "--sampler", "random", "--seed", "2",
            "--layers", "1,6", "--heads", "4", "--hidden", "384", "--ffn", "256,1536", "--budget-ms", str(budget_ms),
            "--proxy-steps", "6", "--eval-every", "3", "--final-steps", "6", *TINY]
    started = time.perf_counter()
    result = kdnas(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"out": out, "args": args, "stdout": result.stdout, "seconds": time.perf_counter() - started}


def test_kdnas_evaluate_rebuilds_the_baselines_the_search_scored_its_winner_against(search_run, isolated_cache):
    """`kdnas evaluate best --baselines` (its functions, with the search's seed 2 for the held-out sentences)
    gives the baselines the fidelity the search's table gave them: they are the same untrained models."""
    from kdnas.evaluation import FinetuneConfig, QualityConfig, evaluate
    from kdnas.evaluation.baselines import distinct_refs, students_baselines, with_verdicts

    best = search_run["out"] / "best"
    record = json.loads((best / "distill.json").read_text())
    assert record["teacher"] == "minilm-l6" and record["corpus"] == "news"  # what the rebuild reads
    built = students_baselines([str(best)], None, "corpus given by the record", seq=128)
    report = with_verdicts(evaluate([str(best)], ["topic"], FinetuneConfig(), measures=("fidelity",), latency=False,
                                    quality=QualityConfig(fidelity_sentences=48, seed=2),
                                    baselines=distinct_refs(built)), built)
    final = json.loads((search_run["out"] / "summary.json").read_text())["final"][0]
    searched = Quality.from_attrs(final["quality"]).fidelity
    rows = {m["model"]: m["fidelity"]["spearman"] for m in report["models"] if m["role"] == "baseline"}
    first = next(name for name in searched if name.startswith("first"))
    assert rows[first] == pytest.approx(searched[first].spearman, abs=1e-4)
    assert rows[f"inherited {final['arch']} (untrained)"] == pytest.approx(
        searched["inherited (untrained)"].spearman, abs=1e-4)
    verdict = report["verdicts"][str(best)]
    assert verdict["start"].startswith("the inherited baseline is this student's own start")


def test_search_writes_every_output(search_run, shared_modes):
    out = search_run["out"]
    for name in ("pareto.html", "report.html", "trials.csv", "summary.json", "study.db", "search.json"):
        assert (out / name).is_file(), name
    best = out / "best"
    for name in ("config.json", "model.safetensors", "model.onnx", "model.int8.onnx", "export.json",
                 "tokenizer.json", "distill.json", "search.json"):
        assert (best / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    final = summary["final"][0]
    # The best trial is shipped, or its FFN neighbour when the proxy ranks that above it
    # (nas.neighbours), unless its exported graph measured over the budget (then the next candidate is).
    skipped, best_arch = [s["arch"] for s in summary["final_over_budget"]], summary["best_trial"]["arch"]
    assert best_arch in (final["arch"], final.get("neighbour_of")) or best_arch in skipped, (skipped, final)
    for neighbour in map(Candidate.from_attrs, summary["final_neighbours"]):  # scored like a trial, at most two
        assert neighbour.reward is not None and neighbour.scored_latency <= summary["budget_ms"]
    assert len(summary["final_neighbours"]) <= 2
    # Within the budget as the verdict states it: the reading that judged the graph fits the limit, and the reading
    # as shipped is kept beside it, over by no more than a host drifts (nas.final._shipping._verdict).
    assert final["steps"] == 6 and final["within_budget"] and final["verdict"]["ms"] <= final["budget_limit_ms"]
    assert final["latency_ms"] == pytest.approx(final["verdict"]["shipped_ms"])
    assert final["latency_ms"] <= DRIFT_BAND * final["budget_limit_ms"]
    # The final run trains on its own, larger transfer set (--final-train 48 vs 32 proxy rows).
    assert final["train"] == 48 and final["train_rows"] == 48
    assert json.loads((best / "distill.json").read_text())["transfer_set"] == {"train": 48, "eval": 8, "seq_len": 32,
                                                                               "unit": "sentence"}
    manifest = json.loads((best / "export.json").read_text())
    if final["budget_graph"] == "model.onnx":
        # model.onnx is the faster of the fused and plain graphs, timed side by side on this host (nas.variant).
        variant = manifest["fp32_variant"]
        assert variant["shipped"] == ("plain" if variant["high"] < 1.0 else "fused")
        assert final["export"]["optimized"] is (variant["shipped"] == "fused")
    else:  # a deeper shape that fits only as INT8 won (6x4x384x256 reads near this budget as INT8): no fp32
        # variant is chosen for it (its INT8 graph stays fused), and its precision says which graph ships
        assert "fp32_variant" not in manifest and final["budget_graph"] in ("model.int8.onnx", "model.mixed.onnx")
    assert manifest["precision"]["graph"] == final["budget_graph"], (  # what a failure needs to be read
        manifest.get("precision", {}).get("why"), {k: final.get(k) for k in ("arch", "dir", "verdict", "neighbour_of")},
        (final.get("precision_plan") or {}).get("label"), [s["arch"] for s in summary["final_over_budget"]])
    # Shipped as its users load it, and measured against what needs no training.
    assert (best / "modules.json").is_file() and (best / "README.md").is_file()
    quality = Quality.from_attrs(final["quality"])
    assert quality.sentences == 48 and quality.student is not None
    assert any(name.startswith("first ") for name in quality.fidelity), quality.fidelity
    assert final["init"]["init"] == "inherit" and "embedding fidelity rho" in search_run["stdout"]
    # and on as many rows of its own transfer set (all 48 here), with the passes its run made over them
    trained = quality.trained_on
    assert trained.sentences == 48 and trained.passes == round(final["steps"] * 8 / 48, 2)
    assert "of its own training rows rho" in search_run["stdout"] and "own training rows" in (best / "README.md").read_text()
    # and the INT8 graph as shipped, on the same held-out sentences, beside the teacher's own INT8 graph
    assert quality.int8.sentences == 48 and -1 <= quality.int8.spearman <= 1
    teacher_int8 = TeacherInt8.from_attrs(summary["teacher_int8"])
    assert teacher_int8.sentences == 48 and 0.9 < teacher_int8.fidelity.spearman < 1.0
    assert teacher_int8.latency.median_ms < summary["teacher_latency"]["median_ms"]
    assert "the teacher as INT8 (no training):" in search_run["stdout"]
    # and the student set against it, as a user chooses between the two (nas.baselines.versus_teacher_int8)
    assert any("the teacher as INT8 (" in line and " ms, rho " in line for line in search_run["stdout"].splitlines())
    # the INT8 graph's line leads where the budget judged that graph (a reading's noise may pick it)
    judged = final["budget_graph"] == "model.int8.onnx"
    assert ("model.int8.onnx, the graph the budget judged: embedding fidelity rho" if judged
            else "model.int8.onnx: embedding fidelity rho") in search_run["stdout"], final["budget_graph"]
    assert "on the same held-out sentences (fp32: " in (best / "README.md").read_text()
    # what the training ran in, as distill.json has it, and said on the card
    assert final["precision"] == json.loads((best / "distill.json").read_text())["precision"]
    assert f"({final['precision']}, " in (best / "README.md").read_text()
    # the probes are not the search's to run; the card and the summary say how to add them to the card
    assert "`kdnas evaluate path/to/this/folder --baselines --measures fidelity,probe --card` adds their table, " \
           "beside the untrained baselines, below" in (best / "README.md").read_text()
    assert f"kdnas evaluate {best} --baselines --measures fidelity,probe --card adds their table, beside the " \
           "untrained baselines, to its model card" in search_run["stdout"]
    from transformers import AutoModel

    model = AutoModel.from_pretrained(best)
    arch = f"{model.config.num_hidden_layers}x{model.config.num_attention_heads}x{model.config.hidden_size}x{model.config.intermediate_size}"
    assert arch == final["arch"]
    # Readable like any file the user makes (a service account or a container's user loads best/),
    # not private like the temporary files and safetensors writer they come from.
    mask = shared_modes.umask()
    assert shared_modes(best) == {"folders": 0o777 & ~mask, "files": 0o666 & ~mask}
    for name in ("pareto.html", "report.html", "trials.csv", "summary.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~mask, name
    # Pages are offline: plotly.js embedded, nothing fetched.
    for page in ("pareto.html", "report.html"):
        text = (out / page).read_text()
        assert not re.search(r"<(script|link)[^>]*(src|href)=[\"']?(https?:)?//", text), page
        assert len(text) > 1_000_000  # plotly.js itself is inside


def test_trials_table_and_reward(search_run):
    out = search_run["out"]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    summary = json.loads((out / "summary.json").read_text())
    teacher_ms = summary["teacher_latency"]["median_ms"]
    # one trial per shape: a shape proposed again is answered from the study and not counted, until every
    # shape of this four-shape space was tried; the six counted trials then hold all four
    counted = [r for r in rows if r["status"] != "repeat"]
    assert len(counted) == 6 and len({r["arch"] for r in rows}) == 4
    assert all("proposed again (not counted)" in r["reason"] for r in rows if r["status"] == "repeat")
    assert [r["arch"] for r in rows if r["status"] == "repeat"] == [
        r["arch"] for i, r in enumerate(rows) if r["status"] == "repeat"
        and r["arch"] in {x["arch"] for x in rows[:i]}]  # a repeat is of a shape tried before
    statuses = {r["status"] for r in rows}
    assert "feasible" in statuses and "infeasible" in statuses, statuses
    for r in rows:
        assert r["arch"] and r["params"] and r["latency_median_ms"] and r["latency_p90_ms"]
        if r["status"] == "feasible":
            # The default fidelity proxy: the reward's loss is 1 - rho on held-out sentences.
            assert float(r["loss"]) == pytest.approx(1 - float(r["fidelity"]), abs=1e-12)
            expected = kdnas_reward(float(r["loss"]), float(r["latency_median_ms"]), teacher_ms)
            assert float(r["reward"]) == pytest.approx(expected, rel=1e-9)
            assert 0 < float(r["loss_se"]) < 0.2 * float(r["loss"]), r  # every scored trial has its error bar
            assert 0 < float(r["l_hs_se"]) < 0.2 * float(r["l_hs_norm"]), r  # and L_HS beside it
        else:
            assert r["reason"], r
    assert any("result copied" in r["reason"] for r in rows), "the repeated shape must not be retrained"


def test_over_budget_trials_never_train(search_run, budget_ms):
    study = load(search_run["out"])
    over = [t for t in study.trials if t.user_attrs.get("status") == "infeasible"]
    assert over
    for t in over:
        assert t.user_attrs["latency"]["median_ms"] > budget_ms
        assert t.constraints["latency"] > 0  # Optuna's constraint mechanism knows it
        assert t.intermediate_values == {}, "an over-budget trial reported training progress"
        assert "last_eval" not in t.user_attrs and "l_hs_norm" not in t.user_attrs
        assert t.user_attrs["seconds"]["distill"] == 0.0 and "step_s" not in t.user_attrs
    within = [t for t in study.trials if t.user_attrs.get("status") == "feasible" and "duplicate_of" not in t.user_attrs]
    # trained and scored once at the end (the fidelity proxy reports no curve to a pruner)
    assert within and all("last_eval" in t.user_attrs and "fidelity" in t.user_attrs and not t.intermediate_values
                          and t.constraints["latency"] <= 0 for t in within)
    # with its pace per update, less the held-out evaluation: what a --timeout forecasts the final run from
    assert all(0 < t.user_attrs["step_s"] * 6 < t.user_attrs["seconds"]["distill"] for t in within)
    assert study.best_trial.user_attrs["status"] == "feasible"


def test_same_command_resumes_without_redoing_and_mismatch_is_refused(search_run, tmp_path):
    out = search_run["out"]
    before = [(t.number, t.state, t.values, t.params) for t in load(out).trials]
    best_files = digest(out / "best" / "model.safetensors")
    again = kdnas(*search_run["args"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert [(t.number, t.state, t.values, t.params) for t in load(out).trials] == before
    assert digest(out / "best" / "model.safetensors") == best_files  # the final phase was not redone

    db = digest(out / "study.db")
    args = list(search_run["args"])
    args[args.index("--proxy-steps") + 1] = "7"
    refused = kdnas(*args)
    assert refused.returncode == 2
    message = refused.stderr.strip()
    assert "\n" not in message and "proxy.steps=6" in message and "proxy.steps=7" in message
    assert "Traceback" not in refused.stderr
    assert digest(out / "study.db") == db
    # the fidelity proxy trains every trial with the final recipe: its method, batch and text define the study
    refused = kdnas(*search_run["args"], "--final-method", "hs")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    message = refused.stderr.strip()
    assert "\n" not in message and 'exists with proxy.method="embed", this run asks proxy.method="hs"' in message, message
    assert digest(out / "study.db") == db


def test_report_command_rebuilds_pages(search_run, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(search_run["out"], out, ignore=shutil.ignore_patterns("best"))
    for name in ("pareto.html", "report.html", "trials.csv", "summary.json"):
        (out / name).unlink()
    # The recorded storage points at the original folder; the copy is read through --storage.
    result = kdnas("report", str(out), "--storage", f"sqlite:///{out / 'study.db'}", "--study-name", "kdnas")
    assert result.returncode == 0, result.stderr
    assert (out / "report.html").stat().st_size > 1_000_000
    assert (out / "trials.csv").read_text() == (search_run["out"] / "trials.csv").read_text()
    missing = kdnas("report", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "\n" not in missing.stderr.strip()


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian `chromium` is required for the report test: apt-get install -y chromium")
    return path


def _check_dashboard_view(seen: dict, study: optuna.Study) -> None:
    """What optuna-dashboard's API shows of a kdnas study: every trial, with its shape, latency and reward."""
    detail = seen[study.study_name]
    assert [t["number"] for t in detail["trials"]] == [t.number for t in study.trials]
    for shown, trial in zip(detail["trials"], study.trials):
        attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
        assert shown["state"].upper() == trial.state.name
        assert attrs["arch"] == trial.user_attrs["arch"] and attrs["status"] == trial.user_attrs["status"]
        if trial.user_attrs["status"] == "feasible":
            assert float(attrs["reward"]) == pytest.approx(trial.user_attrs["reward"])
            assert json.loads(attrs["latency"])["median_ms"] == trial.user_attrs["latency"]["median_ms"]
    assert "teacher_latency" in {a["key"] for a in detail["user_attrs"]}


def test_optuna_dashboard_shows_the_study_from_sqlite_and_journal(search_run, tmp_path, dashboard):
    out = search_run["out"]
    study = load(out)
    _check_dashboard_view(dashboard(f"sqlite:///{out / 'study.db'}"), study)
    journal = tmp_path / "journal.log"  # the same study in a journal file, as `--storage journal:PATH` writes it
    optuna.copy_study(from_study_name="kdnas", from_storage=f"sqlite:///{out / 'study.db'}",
                      to_storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))))
    _check_dashboard_view(dashboard(str(journal)), study)


def test_report_page_renders_in_headless_chromium(search_run):
    """Open report.html in a real headless Chromium: plots drawn, no JS error; keep a screenshot."""
    out = search_run["out"]
    probe = out / "report-probe.html"
    # Record any uncaught error on the page itself, so the dumped DOM says whether one happened.
    catcher = ("<script>window.addEventListener('error', function (e) {"
               " document.documentElement.setAttribute('data-js-error', String(e.message)); });</script>")
    probe.write_text((out / "report.html").read_text().replace("<head>", "<head>" + catcher, 1))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile_dir:
        flags = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", "--virtual-time-budget=15000",
                 "--window-size=1400,2600"]
        dom = subprocess.run([*flags, "--enable-logging=stderr", "--v=0", "--dump-dom", probe.as_uri()],
                             capture_output=True, text=True, timeout=180)
        subprocess.run([*flags, f"--screenshot={shot}", probe.as_uri()], capture_output=True, timeout=180)
    html = dom.stdout
    error = re.search(r"<html[^>]*data-js-error=\"([^\"]*)\"", html)
    assert error is None, f"JavaScript error on the page: {error and error.group(1)}"
    assert "<html" in html and "</html>" in html, "no DOM was dumped"
    assert "Uncaught" not in dom.stderr, [line for line in dom.stderr.splitlines() if "Uncaught" in line]
    assert html.count('class="main-svg"') >= 10, "plotly did not draw the five figures"
    assert "shipped student, model.int8.onnx (1)" in html, "the shipped students were not drawn"
    # Trace points: one <path class="point"> per plotted marker; bars for the importances.
    study = load(out)
    plotted = sum(1 for t in study.trials if t.user_attrs.get("latency"))
    assert html.count('class="point"') >= plotted, (html.count('class="point"'), plotted)
    trained = sum(1 for t in study.trials if t.user_attrs.get("reward") is not None and "duplicate_of" not in t.user_attrs)
    if trained >= 2:
        assert 'class="trace bars"' in html, "the importance bars were not drawn"
    else:  # the page says why there is no importance chart
        assert "Parameter importances needs at least 2 trained trials" in html
    assert "<table id=\"trials\">" in html and html.count("<tr class=") == len(study.trials)
    assert shot.is_file() and shot.stat().st_size > 50_000


def _wait_for(out: Path, predicate, timeout: float, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> optuna.Study:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = log.read_text()[-3000:] if log is not None and log.is_file() else ""
            pytest.fail(f"the search exited (code {proc.returncode}) before reaching the state to kill it in:\n{said}")
        # search.json is written after the study exists: opening study.db before that would race the
        # search's own schema creation (this process would create tables in the file it is creating).
        if (out / "search.json").is_file():
            try:
                study = load(out)
                if predicate(study):
                    return study
            except (KeyError, optuna.exceptions.OptunaError, Exception):
                pass
        time.sleep(0.3)
    pytest.fail("the search never reached the state to kill it in")


# 117 s of a default run that reached 14 min 29 s on a busy host (2026-11-26): it runs in .ci/run's slow set, beside
# the killed worker of a shared study (test_postgres.py); resume without a kill stays in the default run.
@pytest.mark.slow
def test_sigkill_mid_trial_resumes_with_every_finished_trial_intact(tmp_path, budget_ms):
    out, targets = tmp_path / "killed", tmp_path / "targets"
    args = ["search", "--out", str(out), "--trials", "3", "--layers", "1-2", "--heads", "12", "--hidden", "384",
            "--ffn", "256,512", "--budget-ms", "1000", "--proxy", "hs", "--proxy-train", "32", "--proxy-batch-size", "4",
            "--proxy-steps", "40", "--eval-every", "5", "--seed", "2",  # seed 2: the rule's shape, then another one
            "--final-steps", "4", "--cache-dir", str(targets), *TINY]  # hs: its pruner reports show a trial mid-distillation
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = tmp_path / "killed.stderr"
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def mid_distill(study):
            states = [t.state for t in study.trials]
            running = [t for t in study.trials if t.state == TrialState.RUNNING]
            return (TrialState.COMPLETE in states and running
                    and running[0].user_attrs.get("phase") == "distill" and running[0].intermediate_values)
        # Generous: on a loaded 2-core machine the first trial alone can take minutes.
        _wait_for(out, mid_distill, timeout=900, proc=proc, log=log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the CLI and any latency worker
        proc.wait()
    killed = [t for t in load(out).trials if t.state == TrialState.RUNNING]
    assert len(killed) == 1
    finished = {t.number: (t.state, t.values, t.params, t.intermediate_values, t.user_attrs)
                for t in load(out).trials if t.state.is_finished()}
    assert finished
    # the finished trial's teacher targets are on disk, under --cache-dir
    written = {p.name: (p.stat().st_mtime_ns, digest(p)) for p in targets.glob("*.bin")}
    assert written, sorted(p.name for p in targets.iterdir())

    result = kdnas(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    # The resumed search read them instead of running the teacher again (not one rewritten); the
    # final run's own, larger transfer set added its targets beside them.
    assert {name: (p.stat().st_mtime_ns, digest(p)) for name, p in
            ((p.name, p) for p in targets.glob("*.bin")) if name in written} == written
    assert len(list(targets.glob("*.bin"))) > len(written)
    after = load(out)
    trials = {t.number: t for t in after.trials}
    for number, kept in finished.items():  # nothing finished was redone or lost
        t = trials[number]
        assert (t.state, t.values, t.params, t.intermediate_values, t.user_attrs) == kept
    dead = trials[killed[0].number]
    assert dead.state == TrialState.FAIL and dead.user_attrs["fail_kind"] == "stale"
    retries = [t for t in after.trials if t.user_attrs.get("retry_of") == dead.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE and retries[0].params == dead.params
    counted = [t for t in after.trials if t.state.is_finished() and t.user_attrs.get("fail_kind") != "stale"
               and t.user_attrs.get("status") not in UNCOUNTED]  # a shape proposed again is answered, not counted
    assert len(counted) == 3
    assert (out / "best" / "model.onnx").is_file()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available here: --device cuda is valid")
def test_device_cuda_without_cuda_is_refused_before_anything(tmp_path):
    out = tmp_path / "gpu"
    _refused(kdnas("search", "--out", str(out), "--device", "cuda", "--trials", "1"), "'cuda'", "no CUDA device")
    assert not out.exists(), "nothing may be written for a refused device"
    journal = tmp_path / "gpu.journal"  # with --workers: refused once, before any worker starts
    _refused(kdnas("search", "--out", str(out), "--device", "cuda", "--trials", "1", "--workers", "2",
                   "--storage", f"journal:{journal}"), "'cuda'", "no CUDA device")
    assert not out.exists() and not journal.exists()


@pytest.mark.parametrize("device", ["gpu", "cuda:x"])
def test_an_unknown_device_is_refused_before_anything(tmp_path, device):
    out = tmp_path / "bad-device"
    _refused(kdnas("search", "--out", str(out), "--device", device, "--trials", "1"), repr(device), "cuda:N")
    assert not out.exists()


@pytest.mark.slow  # 80 s; the Pareto finalist rule is unit-tested in the default run (test_nas_reward_space.py)
def test_pareto_objective_with_nsga2_end_to_end(tmp_path, budget_ms):
    out = tmp_path / "pareto"
    # No --heads: the inherited default keeps the teacher's head size (32), so heads = 96 / 32 = 3
    # are derived, not sampled, and must still reach the final phase and the pages.
    result = kdnas("search", "--out", str(out), "--trials", "4", "--objective", "pareto", "--sampler", "nsga2",
                   "--seed", "1", "--layers", "1", "--hidden", "96", "--ffn", "256,1536",
                   "--budget-ms", str(budget_ms), "--proxy-steps", "4", "--eval-every", "2", "--final-steps", "2", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    study = load(out)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    assert len([t for t in study.trials if t.state.is_finished()]) == 4
    assert not any(t.intermediate_values for t in study.trials), "a Pareto study has no pruner reports"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["reward"]["objective"] == "pareto" and summary["settings"]["sampler"] == "nsga2"
    front = summary["pareto_front"]
    assert front and summary["final"][0]["trial"] in front
    rows = {int(r["number"]): r for r in csv.DictReader((out / "trials.csv").open())}
    shipped = rows[summary["final"][0]["trial"]]
    # The shipped member is the front's best by reward.
    assert float(shipped["reward"]) == max(float(rows[n]["reward"]) for n in front)
    assert {r["arch"] for r in rows.values()} <= {"1x3x96x256", "1x3x96x1536"}
    assert summary["settings"]["space"]["head_size"] == 32 and "heads" not in study.trials[0].params
    assert (out / "best" / "model.onnx").is_file() and "pareto" in (out / "pareto.html").read_text().lower()


def _refused(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    for word in words:
        assert word in message, message


@pytest.mark.slow  # a whole search with two budgets, about 3 min on 2 cores; its parts are unit-tested in test_budgets
def test_several_budgets_ship_a_graph_each_within_its_budget_and_a_rerun_resumes(tmp_path):
    from kdnas.latency import profile

    one_layer = profile("1x4x384x1536", batch=1, seq=128, threads=2).median_ms  # the dearest one-layer shape
    dear = profile("6x4x384x1536", batch=1, seq=128, threads=2).median_ms
    # every shape fits the large budget; the small one fits one-layer shapes only, with room on both sides for a
    # noisy host (a budget at the geometric mean of the extremes let 6x4x384x256 read within its 1 % tolerance)
    large, small = round(1.5 * dear, 2), round(1.3 * one_layer, 2)
    out = tmp_path / "run"
    args = ["search", "--out", str(out), "--trials", "5", "--sampler", "random", "--seed", "2", "--layers", "1,6",
            "--heads", "4", "--hidden", "384", "--ffn", "256,1536", "--budget-ms", f"{small},{large}",
            "--proxy-steps", "4", "--eval-every", "2", "--final-steps", "4", *TINY]
    done = kdnas(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    budgets = summary["budgets"]
    assert [(b["label"], b["budget_ms"], b["folder"]) for b in budgets] == [
        (f"{large:g}ms", large, f"best-{large:g}ms"), (f"{small:g}ms", small, f"best-{small:g}ms")]
    assert summary["budget_ms"] == large  # the trials' gate: the largest budget
    # The large budget fits the teacher's own fp32 graph (6x12x384x1536 reads about as 6x4x384x1536 does): its
    # folder holds the teacher, and the student trained for it stands aside in finalists/ (nas.final._teacher).
    teacher = {t.budget: t for t in map(FinalTeacher.from_attrs, summary["final_teacher"])}
    assert teacher[f"{large:g}ms"].shipped and teacher[f"{large:g}ms"].dir == str(out / budgets[0]["folder"])
    for b in budgets:
        [final] = b["final"]
        # within the budget with its tolerance (a graph fits up to 1 % over: the rule the search applies)
        assert final["budget_limit_ms"] == pytest.approx(b["budget_ms"] * 1.01)  # the default tolerance
        assert final["within_budget"] and final["latency_ms"] <= final["budget_limit_ms"], final
        assert b["budget_ms"] == final["budget_ms"]
        displaced = b["label"] in teacher and teacher[b["label"]].shipped
        student = out / "finalists" / b["label"] / f"student-{final['arch']}" if displaced else out / b["folder"]
        assert final["budget"] == b["label"] and final["dir"] == str(student)
        assert (out / b["folder"] / "model.onnx").is_file() and (out / b["folder"] / "modules.json").is_file()
        assert (student / "model.onnx").is_file() and f"final {student} (the {b['label']} budget" in done.stdout
    assert budgets[1]["final"][0]["arch"].startswith("1x") and not (out / "best").exists()
    assert not teacher.get(f"{small:g}ms", {}).get("shipped")  # the teacher's all-INT8 graph reads over it
    # every trained trial within the small budget is a candidate for both budgets
    assert set(budgets[1]["trials_within"]) <= set(budgets[0]["trials_within"])
    # the one-line rule's shape of each budget is among the study's trials, once where the two agree (the large
    # budget's depth depends on how the teacher reads beside these shapes on a busy host); the small budget's
    # is one layer
    trials = load(out).trials
    rules = [t.params for t in trials if t.user_attrs.get("origin") == "rule"]
    assert len(rules) in (1, 2) and rules[-1]["layers"] == 1
    assert len(rules) == 1 or rules[0] != rules[1]
    assert all(t.number < len(rules) for t in trials if t.user_attrs.get("origin") == "rule")  # the first trials
    # the Pareto page shows both shipped students with their INT8 graphs and baselines
    page = (out / "pareto.html").read_text()
    assert "shipped student, model.onnx (2)" in page and "shipped student, model.int8.onnx (2)" in page
    assert "its untrained baselines" in page and f"{small:g}ms budget" in page

    before = {b["folder"]: digest(out / b["folder"] / "model.safetensors") for b in budgets}
    trials = [(t.number, t.state, t.values) for t in load(out).trials]
    again = kdnas(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {f: digest(out / f / "model.safetensors") for f in before} == before  # resumed: nothing trained again
    assert [(t.number, t.state, t.values) for t in load(out).trials] == trials

    fresh = tmp_path / "under"
    refused = kdnas("search", "--out", str(fresh), "--budget-ms", f"{large},{one_layer / 20:.4f}", *args[3:17], *TINY)
    assert refused.returncode == 2 and "is below every precision plan of the fastest student in the space" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not fresh.exists()


@pytest.mark.slow  # eleven refused commands, ~115 s on 2 cores; each flag's check is unit-tested in test_cli_search_flags
def test_bad_input_is_one_line_and_loses_nothing(search_run, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    out = search_run["out"]
    db = digest(out / "study.db")
    args = list(search_run["args"])

    def swap(flag: str, value: str) -> list[str]:
        changed = list(args)
        changed[changed.index(flag) + 1] = value
        return changed

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # A worker on another CPU model: its latencies would not compare with the study's budget.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out, elsewhere)
    study = load(elsewhere)
    settings = study.user_attrs["kdnas_settings"]
    assert settings["latency_machine"]["cpu"] and settings["latency_machine"]["runtime"].startswith("onnxruntime-auto ")
    study.set_user_attr("kdnas_settings", {**settings, "latency_machine": {**settings["latency_machine"],
                                                                           "cpu": "Some Other CPU 9000"}})
    moved = digest(elsewhere / "study.db")
    fresh, fresh_journal = tmp_path / "fresh", tmp_path / "fresh-journal"
    cases = [  # (command line, words the one-line refusal names); independent, so run two at a time
        (swap("--trials", "0"), ("trial",)),
        (swap("--trials", "-3"), ("trial",)),
        (swap("--heads", "5"), ("no valid shape",)),
        ([*swap("--heads", "5"), "--out", str(tmp_path / "new")], ("no valid shape",)),
        (swap("--budget-ms", "-1"), ("budget",)),
        ([*args, "--storage", f"sqlite:///{tmp_path}/no/such/dir/x.db"], ("storage",)),
        # A storage found unusable once --out is made: the folders made for it are removed again.
        ([*swap("--out", str(tmp_path / "new" / "deeper")), "--storage", "nosuchdb://x"], ("nosuchdb://x", "cannot be opened")),
        (swap("--out", str(blocker / "sub")), ("not writable",)),
        ([*swap("--out", str(tmp_path / "new")), "--cache-dir", str(blocker / "targets")],
         ("--cache-dir", "not writable", "'none'")),
        (swap("--out", str(elsewhere)), ("was timed on", "Some Other CPU 9000", "CPU model")),
        # A budget under the fastest shape of the space names that shape and its latency.
        ([*swap("--out", str(fresh)), "--budget-ms", "0.001"], ("below every precision plan of the fastest", "1x4x384x256", "ms median")),
        ([*swap("--out", str(fresh_journal)), "--storage", f"journal:{fresh_journal}/j.log", "--budget-ms", "0.001"],
         ("below every precision plan of the fastest",)),  # its own storage file in the new --out: removed with the folder
        (swap("--proxy-sentences", "5"), ("proxy_sentences=5", "at least 50")),
        # A corpus or --seq found wrong once the teacher is loaded: still before --out or a study.db is made.
        ([*swap("--out", str(tmp_path / "new")), "--corpus", str(tmp_path / "no-such-corpus")],
         ("no-such-corpus", "neither a bundled name")),
        ([*swap("--out", str(tmp_path / "new")), "--seq", "100000"], ("100000", "allowed 8..")),
        # Refused once the study was made (the seed, by the sampler) or per trial after trials ran (the
        # exponent, the layer map), or by the first latency reading: now before anything is written.
        ([*swap("--out", str(tmp_path / "new")), "--seed", "-1"], ("seed -1 is invalid",)),
        ([*swap("--out", str(tmp_path / "new")), "--exponent", "nan"], ("exponent nan must be a finite number",)),
        ([*swap("--out", str(tmp_path / "new")), "--layer-map", "bogus"], ("layer map 'bogus' is invalid",)),
        ([*swap("--out", str(tmp_path / "new")), "--final-embed-terms", "mse+bogus"], ("embed_terms='mse+bogus'",)),
        ([*swap("--out", str(tmp_path / "new")), "--runtime", "bogus"], ("runtime 'bogus' is invalid",)),
        ([*swap("--out", str(tmp_path / "new")), "--threads", "1000"], ("threads=1000 exceeds the",)),
        ([*swap("--out", str(tmp_path / "new")), "--latency-seq", "1000"], ("1000", "512 positions")),
        # A final method the space's head counts cannot take: was a failed final run after the whole search.
        ([*swap("--out", str(tmp_path / "new")), "--final-method", "minilm"], ("--final-method minilm", "4 heads")),
        # Every held-out sentence taken by --quality-sentences: none left for the fidelity proxy's probe.
        (swap("--quality-sentences", "100000"), ("holds out 0 sentences", "--proxy hs")),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: kdnas(*case[0]), cases))
    for (_, words), result in zip(cases, results):
        _refused(result, *words)
    assert not (tmp_path / "new").exists()  # refused before the folder or its study.db is made
    assert not fresh.exists()  # a budget under the fastest shape: the folder and study.db made for it removed
    assert not fresh_journal.exists()
    assert digest(out / "study.db") == db and digest(elsewhere / "study.db") == moved


@pytest.mark.slow  # two small searches, one killed mid-final-run (72 s on 2 cores); the saves are tested in test_checkpoint
def test_a_search_killed_during_its_final_run_goes_on_from_its_last_save(tmp_path):
    out = tmp_path / "run"
    args = ["search", "--out", str(out), "--trials", "1", "--layers", "1", "--heads", "12", "--hidden", "384",
            "--ffn", "256", "--budget-ms", "1000", "--proxy-steps", "4", "--final-steps", "600",
            "--final-save-every", "50", *TINY]
    state = out / ".best.state.pt"
    log = tmp_path / "killed.stderr"
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 900
        while not state.is_file():  # killed at its first save, 550 steps before the run would end
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "best").exists()
    result = kdnas(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    went_on = re.search(r"going on from .*\.best\.state\.pt, saved after step (\d+) of 600", result.stderr)
    assert went_on, result.stderr[-3000:]
    record = json.loads((trained(out) / "distill.json").read_text())
    assert record["resumed_from"] == int(went_on[1]) >= 50 and record["resumed_from"] % 50 == 0
    assert record["steps"] == 600 and not state.exists()  # shipped: the save is gone


@pytest.mark.slow  # the default search under the least --timeout that works: about 5 min on 2 cores
def test_the_least_timeout_that_works_ends_within_its_margin(tmp_path, isolated_cache):
    """`kdnas search --timeout MIN_TIMEOUT_S` (the bundled teacher, an empty cache): the whole command ends within
    the limit and the margin the docs state for the final stage's export and writing (nas.time_limit)."""
    from kdnas.nas.config import MIN_TIMEOUT_S
    from kdnas.nas.time_limit import TIMEOUT_MARGIN_S

    out = tmp_path / "run"
    started = time.monotonic()
    result = kdnas("search", "--out", str(out), "--timeout", str(MIN_TIMEOUT_S), "--no-progress")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert took <= MIN_TIMEOUT_S + TIMEOUT_MARGIN_S, (took, result.stderr[-2000:], _where_the_time_went(summary))
    assert summary["final"], "something shipped"


def _where_the_time_went(summary: dict) -> dict:
    """What a run over its --timeout needs to be read: each phase's seconds as the summary records them."""
    plans = summary.get("teacher_plans") or {}
    return {"trials": [(t.get("arch"), t.get("seconds_total"), t.get("seconds_teacher"))
                       for t in summary.get("trials_table") or []],
            "teacher_plans_s": plans.get("seconds"), "sensitivity_s": plans.get("sensitivity_s"),
            "again": [b.get("again") for b in plans.get("budgets") or []],
            "deferred": [b.get("deferred") for b in plans.get("budgets") or []],
            "final": [(f.get("arch"), f.get("steps"), f.get("seconds")) for f in summary.get("final") or []],
            "ledger": summary.get("time_ledger")}


@pytest.mark.slow  # a full search, ~65 s; the step plan is unit-tested in test_time_limit and test_trainer
def test_a_timeout_with_time_to_spare_trains_past_final_steps_on_more_text(tmp_path):
    out = tmp_path / "run"
    # Minutes for a run of seconds: the final run goes on to --final-max-steps, and its transfer set
    # grows so that no sentence is seen more than five times (48 sentences cover 30 steps of 8). Its own
    # targets folder: another run's targets of more sentences would be taken up to one pass (nas.final).
    result = kdnas("search", "--out", str(out), "--trials", "1", "--layers", "1", "--heads", "12", "--hidden", "384",
                   "--ffn", "256", "--budget-ms", "1000", "--proxy-steps", "4", "--final-steps", "30",
                   "--final-max-steps", "60", "--timeout", "300", "--cache-dir", str(tmp_path / "targets"), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after 60 steps (30 planned, more in the time --timeout 300 s left) of embed" in result.stdout
    student = trained(out)  # the teacher fits --budget-ms 1000 and ships in best/; the student beside it
    shipped = json.loads((student / "search.json").read_text())
    assert (shipped["steps"], shipped["steps_planned"], shipped["steps_most"]) == (60, 30, 60)
    assert shipped["train"] == 48 and shipped["train_rows"] == 60 * 8 // 5  # grown from 48 to five passes
    record = json.loads((student / "distill.json").read_text())
    assert record["transfer_set"]["train"] == shipped["train_rows"]  # what the baselines are rebuilt from
    assert "60 steps (30 planned, more in the time --timeout 300 s left)" in (student / "README.md").read_text()


@pytest.mark.slow  # a full search (60-130 s on 2 cores); the rule is tested in test_nas_reward_space, the loop in test_trainer
def test_a_final_run_on_a_corpus_too_small_for_its_steps_perturbs_half_its_batches(tmp_path, news_texts):
    # 24 documents of two sentences each: the final run's 40 steps of 8 would see each sentence more
    # than five times, so half its batches are perturbed and labelled by the teacher live; the final run
    # takes the embed terms asked for (the two-layer student's intermediate layer too).
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n\n".join(" ".join(doc.split(". ")[:2]) for doc in news_texts[:24]) + "\n")
    out = tmp_path / "run"
    result = kdnas("search", "--out", str(out), "--corpus", str(corpus), "--trials", "1", "--layers", "2",
                   "--heads", "12", "--hidden", "384", "--ffn", "256", "--budget-ms", "1000", "--proxy", "hs",
                   "--proxy-train", "32", "--proxy-batch-size", "4", "--proxy-steps", "4", "--eval-every", "2",
                   "--final-steps", "40", *TINY, "--quality-sentences", "0",
                   "--final-embed-terms", "mse+cos+rel+mid", "--runtime", "onnxruntime")  # plans need held-out text
    assert result.returncode == 0, result.stderr[-3000:]
    shipped = json.loads((out / "best" / "search.json").read_text())
    assert shipped["augment"] == 0.5 and shipped["train_rows"] * 5 < 40 * 8, shipped["train_rows"]
    assert "50% of the batches are perturbed, the teacher labelling them (--final-augment 0: none)" in result.stderr
    assert "50% of the batches perturbed, embed terms mse+cos+rel+mid" in (out / "best" / "README.md").read_text()
    config = json.loads((out / "best" / "distill.json").read_text())["config"]
    assert config["augment"] == 0.5 and config["embed_terms"] == "mse+cos+rel+mid"


@pytest.mark.slow  # a whole TPE search of eight shapes and tiny steps, about 2 min on 2 cores
def test_trials_buy_distinct_shapes_where_tpe_repeats_them(tmp_path):
    """One trial per shape: in a space of eight shapes TPE proposes shapes again; each repeat is answered from the
    study (its value copied for the sampler, nothing trained) and not counted, so --trials 6 buys six shapes."""
    out = tmp_path / "run"
    result = kdnas("search", "--out", str(out), "--trials", "6", "--layers", "1,2", "--heads", "4", "--hidden", "384",
                   "--ffn", "256,512,1024,1536", "--budget-ms", "1000", "--proxy-steps", "2", "--final-steps", "0",
                   "--runtime", "onnxruntime", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    counted = [r for r in rows if r["status"] != "repeat"]
    assert len(counted) == 6 and len({r["arch"] for r in counted}) == 6
    repeats = [r for r in rows if r["status"] == "repeat"]
    assert all("proposed again (not counted)" in r["reason"] and r["arch"] in {c["arch"] for c in counted}
               for r in repeats)
