"""Storage, settings check and stale-trial recovery on real Optuna storages (SQLite, journal)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from kdnas.core.errors import KdnasError
from kdnas.nas.resume import claim_retry, counted_trials, enqueue_retries, fail_stale_trials, worker_identity
from kdnas.nas.schema import SETTINGS_ATTR
from kdnas.nas.storage import (check_settings, default_storage_url, find_study, holds_studies, open_storage,
                               storage_file)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_settings_mismatch_is_one_line_and_leaves_the_study_untouched(tmp_path):
    url = default_storage_url(tmp_path)
    study = optuna.create_study(storage=open_storage(url), study_name="s", direction="maximize")
    study.set_user_attr(SETTINGS_ATTR, {"budget_ms": 8.0, "space": {"layers": [1, 2]}})
    study.enqueue_trial({"x": 1})
    before = _digest(tmp_path / "study.db")

    found = find_study(open_storage(url), "s")
    check_settings(found, {"budget_ms": 8.0, "space": {"layers": [1, 2]}}, url)  # same: fine
    with pytest.raises(KdnasError) as err:
        check_settings(found, {"budget_ms": 6.0, "space": {"layers": [1, 2]}}, url)
    message = str(err.value)
    assert "\n" not in message and "budget_ms=8.0" in message and "budget_ms=6.0" in message
    assert _digest(tmp_path / "study.db") == before
    assert find_study(open_storage(url), "nope") is None


def test_a_study_a_worker_beside_this_one_just_created_is_read_once_its_settings_are_written(tmp_path):
    """Three workers on one journal file: one found the study between its creator's create and settings,
    and refused it as not kdnas's (exit 2). Found without settings and with no trial but queued ones, it is
    read once they are."""
    import threading

    from kdnas.nas.search import _found_study

    storage = open_storage(f"journal:{tmp_path / 'study.log'}")
    assert _found_study(storage, "s") is None
    created = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    created.enqueue_trial({"x": 1})  # the creator queues the rule's shapes before it writes the settings
    threading.Timer(0.3, created.set_user_attr, (SETTINGS_ATTR, {"budget_ms": 8.0})).start()
    t0 = time.monotonic()
    found = _found_study(open_storage(f"journal:{tmp_path / 'study.log'}"), "s")
    assert found.user_attrs[SETTINGS_ATTR] == {"budget_ms": 8.0} and time.monotonic() - t0 >= 0.3
    # a study with a trial that ran and no settings is another tool's: found as it is, at once (check_settings
    # refuses it)
    other = optuna.create_study(storage=storage, study_name="other", direction="maximize")
    other.add_trial(optuna.trial.create_trial(value=1.0))
    t0 = time.monotonic()
    assert SETTINGS_ATTR not in _found_study(storage, "other").user_attrs and time.monotonic() - t0 < 5
    with pytest.raises(KdnasError, match="was not created by kdnas search"):
        check_settings(_found_study(storage, "other"), {}, "journal:x")


def test_unopenable_storages_are_user_errors(tmp_path):
    for url in (f"sqlite:///{tmp_path}/missing-dir/x.db", "postgresql://u:p@127.0.0.1:1/db", "nosuchdialect://x",
                f"journal:{tmp_path}/missing-dir/j.log"):
        with pytest.raises(KdnasError, match="storage"):
            open_storage(url)
    with pytest.raises(KdnasError, match="does not exist"):
        open_storage(f"sqlite:///{tmp_path}/absent.db", must_exist=True)
    assert not (tmp_path / "absent.db").exists()


def _dead_worker() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return {**worker_identity().to_attrs(), "pid": proc.pid}  # as the storage holds it


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_trials_of_dead_workers_are_failed_and_retried_once(tmp_path, kind):
    url = default_storage_url(tmp_path) if kind == "sqlite" else f"journal:{tmp_path}/journal.log"
    study = optuna.create_study(storage=open_storage(url), study_name="s", direction="maximize")
    done = study.ask({"layers": optuna.distributions.IntDistribution(1, 6)})
    study.tell(done, 0.5)
    dead = study.ask({"layers": optuna.distributions.IntDistribution(1, 6)})
    dead.set_user_attr("worker", _dead_worker())
    dead.set_user_attr("alive_at", time.time())
    dead.set_user_attr("phase", "distill")
    live = study.ask({"layers": optuna.distributions.IntDistribution(1, 6)})
    live.set_user_attr("worker", worker_identity().to_attrs())  # this very process: alive
    live.set_user_attr("alive_at", time.time())

    assert fail_stale_trials(study, stale_after_s=3600) == [dead.number]
    frozen = {t.number: t for t in study.get_trials()}
    assert frozen[dead.number].state == TrialState.FAIL
    assert "stale" in frozen[dead.number].user_attrs["reason"]
    assert frozen[live.number].state == TrialState.RUNNING
    assert frozen[done.number].state == TrialState.COMPLETE and frozen[done.number].value == 0.5

    assert enqueue_retries(study) == [dead.number]
    assert enqueue_retries(study) == []  # once only
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == dead.number
    assert waiting[0].system_attrs["fixed_params"] == frozen[dead.number].params  # asked again as is
    assert counted_trials(study) == 1  # the stale failure counts through its retry, not itself


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_workers_that_see_one_failure_together_queue_one_retry(tmp_path, kind):
    """Two workers' recover() can read the same failed trial before either has queued its retry (two
    retries were seen with three PostgreSQL workers): the retry goes to the worker that claims it."""
    url = default_storage_url(tmp_path) if kind == "sqlite" else f"journal:{tmp_path}/journal.log"
    study = optuna.create_study(storage=open_storage(url), study_name="s", direction="maximize")
    dead = study.ask({"layers": optuna.distributions.IntDistribution(1, 6)})
    dead.set_user_attr("worker", _dead_worker())
    dead.set_user_attr("alive_at", time.time())
    assert fail_stale_trials(study, stale_after_s=3600) == [dead.number]
    other = optuna.load_study(study_name="s", storage=open_storage(url))  # a second worker's handle

    failed = other.get_trials(states=(TrialState.FAIL,))[0]
    assert claim_retry(other, failed)  # the other worker got there first, its retry not yet queued
    assert enqueue_retries(study) == []  # so this one queues none
    assert not claim_retry(study, failed) and not claim_retry(other, failed)  # nor does anyone again
    assert study.get_trials(states=(TrialState.WAITING,)) == []
    assert "s" in optuna.get_all_study_names(storage=open_storage(url))


def test_silent_worker_on_another_host_goes_stale_after_the_grace_time(tmp_path):
    study = optuna.create_study(storage=open_storage(default_storage_url(tmp_path)), study_name="s")
    trial = study.ask()
    trial.set_user_attr("worker", {"host": "elsewhere", "pid": 1, "started": 0.0})
    trial.set_user_attr("alive_at", time.time() - 100)
    assert fail_stale_trials(study, stale_after_s=1000) == []
    assert fail_stale_trials(study, stale_after_s=10) == [trial.number]


def test_processes_opening_a_new_sqlite_file_at_once_all_get_the_storage(tmp_path):
    """A search and a report (or two workers) starting together both create the schema; none may fail."""
    import threading

    for attempt in range(5):
        url = f"sqlite:///{tmp_path / f'new{attempt}.db'}"
        start, errors = threading.Barrier(4), []

        def open_it():
            start.wait()
            try:
                open_storage(url)
            except Exception as err:  # noqa: BLE001 - the test reports whatever went wrong
                errors.append(err)

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors[0]


def test_a_storage_only_read_that_is_no_study_database_is_refused_untouched(tmp_path):
    """`kdnas report --storage` on the user's own SQLite file (or an empty one) used to add Optuna's schema."""
    import sqlite3

    mine, empty = tmp_path / "mine.db", tmp_path / "empty.db"
    with sqlite3.connect(mine) as db:
        db.execute("create table notes(x)")
    empty.write_bytes(b"")
    before = {path: _digest(path) for path in (mine, empty)}
    for path in (mine, empty):
        with pytest.raises(KdnasError, match="holds no Optuna studies"):
            open_storage(f"sqlite:///{path}", must_exist=True)
    assert {path: _digest(path) for path in (mine, empty)} == before
    made = tmp_path / "study.db"
    open_storage(f"sqlite:///{made}")  # a search makes the schema; a report then opens it
    open_storage(f"sqlite:///{made}", must_exist=True)


def test_a_storage_file_holds_studies_once_one_is_created_in_it(tmp_path):
    journal, db = f"journal:{tmp_path / 'j.log'}", default_storage_url(tmp_path)
    assert storage_file(journal) == tmp_path / "j.log" and storage_file(db) == tmp_path / "study.db"
    assert storage_file("postgresql://u@h/db") is None and holds_studies("postgresql://u@h/db")  # never removed
    assert not holds_studies(journal) and not holds_studies(db)  # not there yet
    for url in (journal, db):
        storage = open_storage(url)
        assert not holds_studies(url)  # opened (the journal empty, the SQLite file with Optuna's schema): no study
        optuna.create_study(storage=storage, study_name="s")
        assert holds_studies(url)
    (tmp_path / "not.db").write_text("the user's own text")
    assert holds_studies(f"sqlite:///{tmp_path / 'not.db'}")  # not readable as a study database: left alone


def test_a_study_of_a_newer_record_version_is_refused_in_one_line():
    import optuna
    import pytest

    from kdnas.core.errors import StorageError
    from kdnas.nas.schema import SCHEMA_VERSION, VERSION_ATTR
    from kdnas.nas.storage import check_settings

    study = optuna.create_study(study_name="newer")
    study.set_user_attr(SETTINGS_ATTR, {"teacher": "minilm-l6"})
    check_settings(study, {"teacher": "minilm-l6"}, "sqlite:///x.db")  # a study of version 1 (none stored) resumes
    study.set_user_attr(VERSION_ATTR, SCHEMA_VERSION + 1)
    with pytest.raises(StorageError, match=rf"record version {SCHEMA_VERSION + 1}; this kdnas reads versions up to "
                                           rf"{SCHEMA_VERSION}: upgrade kdnas"):
        check_settings(study, {"teacher": "minilm-l6"}, "sqlite:///x.db")


def test_the_final_stage_is_claimed_once_and_a_dead_workers_claim_is_taken_over(tmp_path):
    """The claim names the live worker that holds it (a typed Worker, stored as JSON); a dead one's is taken."""
    from kdnas.nas.final import claim_final
    from kdnas.nas.schema import recorded

    storage = open_storage(f"journal:{tmp_path}/journal.log")
    study = optuna.create_study(storage=storage, study_name="s")
    assert claim_final(study, stale_after_s=3600) is None
    claim = optuna.load_study(study_name="s:final", storage=storage)
    assert set(claim.user_attrs["worker"]) == {"host", "pid", "started", "claimed_at"}
    assert recorded(claim).worker.pid == os.getpid()
    held = claim_final(study, stale_after_s=3600)  # a second worker (here: this process, alive) is refused
    assert held.startswith(f"the final stage is run by another worker (host {socket.gethostname()}, pid {os.getpid()})")
    claim.set_user_attr("worker", {**_dead_worker(), "claimed_at": time.time()})
    assert claim_final(study, stale_after_s=3600) is None  # the dead worker's claim is taken over
    assert recorded(optuna.load_study(study_name="s:final", storage=storage)).worker.pid == os.getpid()
