"""Where a study lives: open the storage, create or resume the study, refuse a mismatched one.

- Default: a SQLite file in the output folder (one worker at a time; SQLite locks the whole file).
- `--storage postgresql+psycopg://...` (psycopg 3, `pip install kdnas[postgres]`) or
  `postgresql://...` (psycopg2): many workers on many machines.
- `--storage journal:PATH`: Optuna's JournalStorage on a file, many workers on one file system.

RDB storages (SQLite, PostgreSQL) get Optuna's heartbeat: a worker that dies leaves a RUNNING trial
whose heartbeat stops; after the grace period the next worker to start a trial marks it FAIL and
`RetryHeartbeatStaleTrialCallback(max_retry=1)` queues its shape once more — after the same claim
as kdnas's own retries (`nas.resume.claim_retry`), so a failure is retried once in all. Journal storage has no
heartbeat; there `nas.resume` keeps the worker's pid and last sign of life instead.

Nothing here writes to an existing study before its settings were compared, so bad input never
changes it.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

import optuna

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent first opens stay a rare race there
    fcntl = None

from kdnas.core.errors import KdnasError, InputError, StorageError, first_line
from kdnas.core.files import atomic_write_text

from .resume import claim_retry
from .schema import StudyFacts, check_version, migrate_settings, stored

HEARTBEAT_S = 30  # a running trial writes its heartbeat this often ...
GRACE_S = 120  # ... and is presumed dead after this long without one (a long evaluation stays well inside)
POINTER_FILE = "search.json"  # in the output folder: how `kdnas report OUT` finds the study


def default_storage_url(out: str | Path) -> str:
    """The study's SQLite file when no --storage is given: OUT/study.db, absolute, so `kdnas report
    OUT` works from any working directory."""
    return f"sqlite:///{(Path(out).expanduser() / 'study.db').resolve()}"


def storage_file(url: str) -> Path | None:
    """The file a file-based storage keeps its studies in (`journal:PATH`, `sqlite:///PATH`); None for a server."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):]).expanduser()
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])  # as SQLAlchemy reads it: no ~ expansion
    return None


def holds_studies(url: str) -> bool:
    """Whether a storage may hold someone's study: a server always may; a journal file once it is not empty
    (opening one makes it empty, a study's creation is its first record); a SQLite file once its `studies`
    table has a row, or when that cannot be read. A file that does not is safe to remove again."""
    path = storage_file(url)
    if path is None or not path.exists():
        return path is None
    if url.startswith("journal:"):
        return path.stat().st_size > 0
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as db:
            return db.execute("SELECT count(*) FROM studies").fetchone()[0] > 0
    except sqlite3.Error:  # no schema, or not SQLite at all: not known to be empty, so left alone
        return True


def open_storage(url: str, *, must_exist: bool = False, heartbeat_s: int = HEARTBEAT_S,
                 grace_s: int = GRACE_S) -> optuna.storages.BaseStorage:
    """Open (or create) the storage at `url`; any failure is a one-line user error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat's arguments
        return _open(url, must_exist, heartbeat_s, grace_s)


def _open(url: str, must_exist: bool, heartbeat_s: int, grace_s: int) -> optuna.storages.BaseStorage:
    try:
        path = storage_file(url)
        if url.startswith("journal:"):
            if must_exist and not path.is_file():
                raise InputError(f"storage {url!r}: journal file {path} does not exist")
            if not path.parent.is_dir():
                raise InputError(f"storage {url!r}: folder {path.parent} does not exist")
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            return optuna.storages.JournalStorage(backend)
        if url.startswith("sqlite:///"):
            if must_exist and not path.is_file():
                raise InputError(f"storage {url!r}: database file {path} does not exist")
            if not path.parent.is_dir():
                raise InputError(f"storage {url!r}: folder {path.parent} does not exist")
            if must_exist:
                _refuse_non_optuna(url)
            return _sqlite_storage(url, path.parent, _heartbeat(heartbeat_s, grace_s))
        if must_exist:
            _refuse_non_optuna(url)
        return _server_storage(url, _heartbeat(heartbeat_s, grace_s))
    except KdnasError:
        raise
    except Exception as err:  # SQLAlchemy / driver errors: bad URL, unreachable server, no driver
        first = first_line(err)
        raise StorageError(f"storage {url!r} cannot be opened: {first}") from None


def _refuse_non_optuna(url: str) -> None:
    """A storage only read (a report) must already hold Optuna's schema: opening it with RDBStorage
    would add the schema to a database that is not a study's — the user's own file or server."""
    import sqlalchemy

    # SQLite: wait for a search's write lock as the storage itself does (`_sqlite_storage`), not fail.
    engine = sqlalchemy.create_engine(url, **({"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}))
    try:
        found = sqlalchemy.inspect(engine).has_table("studies")
    finally:
        engine.dispose()
    if not found:
        raise InputError(f"storage {url!r} holds no Optuna studies (not a study's database); give the --storage "
                         "a search wrote")


def _heartbeat(interval_s: int, grace_s: int) -> dict[str, Any]:
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)

    def claimed_retry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if claim_retry(study, trial):  # the same claim as kdnas's own retries: one retry in all
            retry(study, trial)

    return {"heartbeat_interval": interval_s, "grace_period": grace_s, "heartbeat_stale_trial_callback": claimed_retry}


def _server_storage(url: str, heartbeat: dict[str, Any], attempts: int = 5) -> optuna.storages.RDBStorage:
    # Workers started together on an empty database all create Optuna's schema; the losers fail on
    # a duplicate table or type. Once the winner is done the schema is there: open it again.
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, **heartbeat)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + random.random())
    raise AssertionError("unreachable")


def _sqlite_storage(url: str, folder: Path, heartbeat: dict[str, Any]) -> optuna.storages.RDBStorage:
    # Two processes opening a new file at once (a search and a worker, or a report) would both
    # create the schema and one would fail on "table already exists"; an advisory lock on the folder
    # makes the first one create it and the others open what it made.
    # A report read while a search writes must wait for the lock, not fail: hence the timeout.
    engine_kwargs = {"connect_args": {"timeout": 60}}
    if fcntl is None:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
    finally:
        os.close(fd)  # closing releases the lock


def find_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study | None:
    """The existing study called `name`, loaded read-only in spirit (no writes), or None."""
    if name not in {s.study_name for s in storage.get_all_studies()}:
        return None
    return optuna.load_study(study_name=name, storage=storage)


def check_settings(study: optuna.Study, wanted: dict[str, Any], url: str) -> None:
    """Refuse to continue a study that was created with other settings (one line: the first difference)."""
    settings = StudyFacts.from_study(study).settings
    if settings is None:
        raise StorageError(
            f"study {study.study_name!r} in {url} was not created by kdnas search; use another --study-name"
        )
    check_version(stored(study), f"study {study.study_name!r} in {url}")
    # The same normalisation the storage applies; a group (`proxy`, `latency`, ...) compared field by field, so
    # the line names the one that differs (`proxy.method`), not the whole group.
    # Both in this version's form (nas.schema.migrate_settings), as the study's facts are read.
    had, wanted = _dotted(settings), _dotted(migrate_settings(json.loads(json.dumps(wanted))))
    for key in sorted(set(had) | set(wanted)):
        if key == "latency_machine" and had.get(key) != wanted.get(key):
            raise InputError(
                f"study {study.study_name!r} in {url} was timed on {_short(had.get(key))}, this worker runs on "
                f"{_short(wanted.get(key))}: its latencies would not compare with the study's budget; run it on "
                "that CPU model and runtime, or start another --study-name"
            )
        if had.get(key) != wanted.get(key):
            raise InputError(
                f"study {study.study_name!r} in {url} exists with {key}={_short(had.get(key))}, "
                f"this run asks {key}={_short(wanted.get(key))}; rerun with the same settings to resume, "
                "or use another --study-name or --out"
            )


def _dotted(settings: dict[str, Any]) -> dict[str, Any]:
    """`{"proxy": {"steps": 30}}` as `{"proxy.steps": 30}`; `space` and `latency_machine` stay whole (compared as one)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and key not in ("space", "latency_machine"):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def write_pointer(out: Path, url: str, study_name: str) -> None:
    atomic_write_text(out / POINTER_FILE, json.dumps({"storage": url, "study_name": study_name}, indent=2) + "\n")


def read_pointer(out: Path) -> tuple[str, str]:
    path = out / POINTER_FILE
    if not path.is_file():
        raise StorageError(f"{out} holds no search ({POINTER_FILE} is missing); give --storage and --study-name")
    try:
        data = json.loads(path.read_text())
        return str(data["storage"]), str(data["study_name"])
    except (ValueError, KeyError, TypeError) as err:  # edited by hand, or not kdnas's file
        raise StorageError(f"{path} is not a search pointer ({type(err).__name__}: {first_line(err)}); "
                           "give --storage and --study-name") from None


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
