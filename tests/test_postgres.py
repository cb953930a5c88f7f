"""Many workers, one study, on a real PostgreSQL server (Debian's postgresql, started here in a
temporary folder on a Unix socket): Optuna's heartbeat and its retry, simultaneous first starts,
and a final stage that runs exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from kdnas.nas.records import trial_rows
from kdnas.nas.resume import counted_trials
from kdnas.nas.storage import HEARTBEAT_S, open_storage
from pgserver import PASSWORD, temporary_server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pg_url():
    with temporary_server() as url:
        yield url


def test_postgres_storage_has_optunas_heartbeat(pg_url):
    storage = open_storage(pg_url)
    assert isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval() == HEARTBEAT_S
    study = optuna.create_study(storage=storage, study_name="plain", direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(optuna.load_study(study_name="plain", storage=open_storage(pg_url)).trials) == 2


def test_a_dead_workers_trial_is_failed_by_heartbeat_and_retried_once(pg_url):
    storage = open_storage(pg_url, heartbeat_s=1, grace_s=2)
    study = optuna.create_study(storage=storage, study_name="heartbeat", direction="maximize")
    dead = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    dead.set_user_attr("phase", "distill")
    storage.record_heartbeat(dead._trial_id)  # then its worker dies: no further heartbeat
    time.sleep(3)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)  # the next worker's first trial
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.COMPLETE], states
    assert study.trials[1].params == study.trials[0].params  # the same shape, retried
    assert counted_trials(study) == 1  # a retried failure counts through its retry
    row = trial_rows(study)[0]
    assert row.reason.startswith("stale") and "retried as trial 1" in row.reason
    assert trial_rows(study)[1].retry_of == 0


def _search_args(pg_url: str, out: Path) -> list[str]:
    return ["search", "--out", str(out), "--storage", pg_url, "--study-name", "two", "--trials", "3",
            "--sampler", "random", "--layers", "1", "--heads", "12", "--hidden", "384", "--ffn", "256,512",
            "--budget-ms", "1000", "--proxy-steps", "4", "--eval-every", "2", "--final-steps", "4",
            "--proxy-eval", "8", "--seq-len", "32", "--final-train", "48",
            "--final-batch-size", "8", "--quality-sentences", "0", "--proxy-sentences", "60", "--no-progress"]


# 2-2.5 minutes (two workers, an empty cache: every latency measured): in the slow set, which .ci/run
# runs after the default one; the default run keeps the server, the heartbeat and the race below.
@pytest.mark.slow
def test_two_workers_share_one_study_and_ship_once(pg_url, tmp_path, dashboard):
    """`--workers 2` starts two copies at the same moment: one study (created once, however the
    race falls), trials from both, and one final stage."""
    out = tmp_path / "run"
    # An empty cache: every latency is measured here, by these two workers, none read from a file.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KDNAS_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "kdnas.cli", *_search_args(pg_url, out), "--workers", "2"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    study = optuna.load_study(study_name="two", storage=open_storage(pg_url))
    assert counted_trials(study) == 3  # exactly --trials: a worker with nothing left to start waits for the others
    assert result.stdout.count("trials: ") == 2  # both workers ran the search to its end (who took which trial is timing)
    names = optuna.get_all_study_names(storage=open_storage(pg_url))
    assert names.count("two") == 1 and names.count("two:final") == 1
    assert (out / "best" / "export.json").is_file() and len(study.user_attrs["final"]) == 1
    # the other worker either saw the claim while the final ran, or found it done
    assert result.stderr.count("the final stage is run by another worker") <= 1
    # Latency: one measurement at a time on this host, on the cores the launcher named.
    assert "latency measured on cores" in result.stderr
    windows = {tuple(t.user_attrs["latency"]["window"]) for t in study.trials
               if t.user_attrs.get("latency") and not t.user_attrs["latency"]["cached"]}
    windows = sorted(windows | {tuple(study.user_attrs[k]["window"]) for k in ("teacher_latency", "fastest")})
    assert len(windows) >= 3 and all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows
    # optuna-dashboard reads the finished study from the server: every trial, its shape and reward.
    seen = dashboard(pg_url)["two"]["trials"]
    assert [t["number"] for t in seen] == [t.number for t in study.trials]
    for shown, trial in zip(seen, study.trials):
        attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
        assert attrs.get("arch") == trial.user_attrs.get("arch") and shown["state"].upper() == trial.state.name
        if "reward" in trial.user_attrs:
            assert float(attrs["reward"]) == pytest.approx(trial.user_attrs["reward"])


# One worker's start: find the study (none yet), measure the new study's facts (here: wait until the
# others are there too), then create it or, when another got there first, open it; exactly the code
# `kdnas search` runs (nas.search._open_study).
_START = """
import sys, time
from kdnas.nas import SearchConfig
from kdnas.nas.schema import StudyFacts
from kdnas.nas.search import _open_study
from kdnas.nas.storage import open_storage
url, at = sys.argv[1], float(sys.argv[2])
cfg = SearchConfig.from_flags(out="unused", storage=url, study_name="race")
storage = open_storage(url)
settings = {"teacher": "minilm-l6", "trials": 6}
measured = []

def new_facts():
    measured.append(True)  # only when no study was found
    time.sleep(max(0.0, at - time.time()))
    return StudyFacts(budget_ms=8.0)

study, facts = _open_study(cfg, storage, url, settings, new_facts)
print(study._study_id, facts.budget_ms, bool(measured), flush=True)
"""


def test_three_workers_started_in_the_same_second_create_one_study(pg_url):
    at = time.time() + 8  # after every process has imported optuna and connected
    workers = [subprocess.Popen([sys.executable, "-c", _START, pg_url, str(at)], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
               for _ in range(3)]
    results = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], [err[-2000:] for _, err in results]
    assert not any("Traceback" in err for _, err in results)
    ids = {out.split()[0] for out, _ in results}
    assert len(ids) == 1 and all(out.split()[1:] == ["8.0", "True"] for out, _ in results), results  # all raced
    assert optuna.get_all_study_names(storage=open_storage(pg_url)).count("race") == 1


def _refused(argv: list[str], *words: str) -> None:
    result = subprocess.run([sys.executable, "-m", "kdnas.cli", *argv, "--no-progress"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    message = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in message and "Traceback" not in message, message
    for word in words:
        assert word in message, message


def test_workers_need_a_shared_storage_and_a_count(tmp_path, pg_url):
    _refused(["search", "--out", str(tmp_path / "x"), "--workers", "2"], "needs a storage that many workers can share")
    _refused(["search", "--out", str(tmp_path / "x"), "--storage", pg_url, "--workers", "0"], "--workers 0",
             "at least 1")
    assert not (tmp_path / "x").exists()


def test_bad_servers_are_one_line_and_touch_nothing(tmp_path, pg_url):
    """Through the CLI; an unreachable server is refused the same way (tests/test_nas_storage.py)."""
    wrong = pg_url.replace(f":{PASSWORD}@", ":not-the-password@")
    _refused(["search", "--out", str(tmp_path / "x"), "--storage", wrong], "cannot be opened", "password")
    no_driver = pg_url.replace("+psycopg:", "+pg8000:")  # a driver that is not installed
    _refused(["search", "--out", str(tmp_path / "x"), "--storage", no_driver], "cannot be opened", "pg8000")
    assert "kdnas" not in optuna.get_all_study_names(open_storage(pg_url))  # no study was created


def _kill_args(storage: str, out: Path) -> list[str]:
    args = _search_args(storage, out)
    args[args.index("--study-name") + 1] = "killed"
    args[args.index("--trials") + 1] = "5"
    args[args.index("--layers") + 1] = "1,2"
    # Eight shapes, so that after the rule's (every new study's first trial) most proposals are new ones that
    # train, not copies of a shape already scored: a copy ends at once and can end a worker before the kill.
    args[args.index("--ffn") + 1] = "256,512,768,1024"
    args[args.index("--proxy-steps") + 1] = "40"
    args[args.index("--eval-every") + 1] = "5"
    return [*args, "--proxy", "hs", "--proxy-train", "32", "--proxy-batch-size", "4"]  # its pruner reports show a trial mid-distillation


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "journal"])
def test_three_workers_one_killed_mid_trial(pg_url, tmp_path, kind):
    """Three workers on one study, one SIGKILLed while it distills: what was finished stays as it
    was, the dead trial is failed with a reason and retried exactly once, the study ends with
    exactly --trials counted trials and none running, the final stage runs once, and the pages
    rebuild from the storage."""
    url = pg_url if kind == "postgres" else f"journal:{tmp_path / 'study.log'}"
    out = tmp_path / "run"
    args = _kill_args(url, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    logs = [tmp_path / f"worker{i}.stderr" for i in range(3)]
    workers = [subprocess.Popen([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=log.open("w")) for log in logs]
    try:
        victim, before = _kill_one_mid_distill(url, workers)
        codes = [w.wait(timeout=1200) for w in workers if w.pid != victim["worker"]["pid"]]
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, 9)
    errors = [log.read_text()[-2000:] for w, log in zip(workers, logs) if w.pid != victim["worker"]["pid"]]
    assert codes == [0, 0], errors
    assert not any("Traceback" in e for e in errors), errors
    study = optuna.load_study(study_name="killed", storage=open_storage(url))
    trials = {t.number: t for t in study.trials}
    for number, kept in before.items():  # nothing finished was redone or changed
        t = trials[number]
        assert (t.state, t.values, t.params, t.user_attrs) == kept
    dead = trials[victim["number"]]
    assert dead.state == TrialState.FAIL and dead.user_attrs["fail_kind"] == "stale"
    assert "stale" in dead.user_attrs["reason"]
    retries = [t for t in study.trials if t.user_attrs.get("retry_of") == dead.number
               or t.system_attrs.get("failed_trial") == dead.number]
    assert len(retries) == 1 and retries[0].params == dead.params and retries[0].state.is_finished()
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    assert counted_trials(study) == 5
    assert len(study.user_attrs["final"]) == 1 and (out / "best" / "export.json").is_file()
    (tmp_path / "pages").mkdir()
    report = subprocess.run([sys.executable, "-m", "kdnas.cli", "report", str(tmp_path / "pages"), "--storage", url,
                             "--study-name", "killed"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "pages" / "report.html").is_file()


def _kill_one_mid_distill(url: str, workers: list[subprocess.Popen]) -> tuple[dict, dict]:
    """SIGKILL the worker of a trial that is distilling once some trial is complete; returns that
    trial (number, worker) and the finished trials as they were at the kill."""
    deadline = time.monotonic() + 900
    pids = {w.pid for w in workers}
    while time.monotonic() < deadline:
        assert all(w.poll() is None for w in workers), "a worker ended before the kill"
        try:
            study = optuna.load_study(study_name="killed", storage=open_storage(url))
        except Exception:  # not created yet
            time.sleep(0.5)
            continue
        trials = study.get_trials()
        running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("phase") == "distill"
                   and t.intermediate_values and t.user_attrs.get("worker", {}).get("pid") in pids]
        if running and any(t.state == TrialState.COMPLETE for t in trials):
            victim = running[0]
            os.killpg(victim.user_attrs["worker"]["pid"], 9)
            time.sleep(1.0)
            before = {t.number: (t.state, t.values, t.params, t.user_attrs)
                      for t in optuna.load_study(study_name="killed", storage=open_storage(url)).get_trials()
                      if t.state.is_finished()}
            return {"number": victim.number, "worker": victim.user_attrs["worker"]}, before
        time.sleep(0.3)
    pytest.fail("no trial reached the state to kill it in")

