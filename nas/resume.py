"""Failed trials: find those whose worker died, retry every failure once, and bound the rest.

On RDB storages Optuna's heartbeat does this first (nas.storage); for journal storage, which has none, and as a backstop, kdnas records who runs each trial
(`worker`: host, pid, process start time) and when it last showed life (`alive_at`, updated at
every phase and evaluation). A RUNNING trial is stale when its worker process is gone from this
host, or, for a worker on another host, when it has been silent for `stale_after_s`.
A stale trial is marked FAIL with the reason. Every failed trial (stale, an error, or Ctrl-C) has
its parameters enqueued once, so the shape is retried and the study still reaches the asked trial
count; a retry that fails too is final (a Ctrl-C never counts against a shape): its shape is
recorded as failed and settled at once whenever it is proposed again (`failed_shapes`).
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings

import optuna
import psutil
from optuna.trial import TrialState

from .schema import UNCOUNTED, TrialStatus, Worker, enqueue, recorded, store_of_another, stored_system

RETRYABLE = ("stale", "interrupted", "error")
# At most this many proposals per `--trials` are proposed again, uncounted, when the latency model puts
# them over the budget (nas.trial): a sampler that keeps proposing such shapes then counts them, so a
# study always ends.
RESAMPLES = 5


def worker_identity() -> Worker:
    return Worker(host=socket.gethostname(), pid=os.getpid(), started=psutil.Process().create_time())


def worker_alive(worker: Worker | None, alive_at: float | None, stale_after_s: float) -> bool:
    if worker is None:
        return alive_at is not None and time.time() - alive_at < stale_after_s
    if worker.host == socket.gethostname():
        try:
            proc = psutil.Process(int(worker.pid))
            # A reused pid belongs to a process started at another time.
            return abs(proc.create_time() - float(worker.started)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, TypeError, ValueError):  # TypeError: a record without its pid or start
            return False
    return alive_at is not None and time.time() - alive_at < stale_after_s


def fail_stale_trials(study: optuna.Study, stale_after_s: float) -> list[int]:
    """Mark the RUNNING trials of dead workers FAIL (reason recorded); returns their numbers.

    A worker on this host is dead when its process is gone: exact and immediate, on every storage.
    A worker on another host is dead after `stale_after_s` of silence; on RDB storages Optuna's
    heartbeat (grace 120 s) normally fails such a trial long before, and this rule is the backstop.
    """
    storage = study._storage  # optuna exposes no public way to change another trial's state
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = recorded(trial).worker
        alive_at = recorded(trial).alive_at
        if alive_at is None and trial.datetime_start is not None:
            alive_at = trial.datetime_start.timestamp()
        if worker_alive(worker, alive_at, stale_after_s):
            continue
        try:
            store_of_another(study, trial, "fail_kind", "stale")
            store_of_another(study, trial, "reason",
                             f"stale: its worker stopped during phase {(recorded(trial).phase or 'start')!r}; retried")
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                failed.append(trial.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker finished or failed it meanwhile
    return failed


def is_retry(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether `trial` retries an earlier failure (queued by kdnas, or by Optuna's heartbeat callback)."""
    return recorded(trial).retry_of is not None  # Optuna's retries too (schema.migrate)


def _final_failure(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.state == TrialState.FAIL and is_retry(trial) and recorded(trial).fail_kind != "interrupted"


def claim_retry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Whether this worker queues the retry of the failed `trial`. Workers that see a failure
    together would each queue it (two retries were seen in a three-worker PostgreSQL run); the claim
    is a study named `<study>:retry:<trial id>` created through the storage, atomic in every Optuna
    storage (as nas.final.claim_final), so exactly one of them does. The storage's trial id, not the
    trial's number: a study deleted and created again under its name numbers its trials anew."""
    try:
        optuna.create_study(storage=study._storage, study_name=f"{study.study_name}:retry:{trial._trial_id}")
        return True
    except optuna.exceptions.DuplicatedStudyError:
        return False


def enqueue_retries(study: optuna.Study) -> list[int]:
    """Queue once the parameters of every failed trial not yet retried; a failed retry is not
    retried again (its shape has failed twice), except after a Ctrl-C."""
    trials = study.get_trials(deepcopy=False)
    retried = _retried(trials)
    queued = []
    for trial in trials:
        if (trial.state == TrialState.FAIL and recorded(trial).fail_kind in RETRYABLE
                and trial.number not in retried and trial.params and not _final_failure(trial)
                and claim_retry(study, trial)):
            enqueue(study, trial.params, {"retry_of": trial.number})
            queued.append(trial.number)
    return queued


def failed_shapes(study: optuna.Study) -> dict[str, str]:
    """{shape: reason} of the shapes whose retry failed as well: they are not trained again."""
    return {recorded(t).arch: str(recorded(t).reason or "its worker died")
            for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
            if _final_failure(t) and recorded(t).arch is not None}


def repeated_failure(study: optuna.Study, last: int) -> str | None:
    """The error of the study's `last` finished trials when they all failed with the same one
    (trials settled without running, as rejected or copied shapes, are skipped)."""
    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()
                and recorded(t).status not in (TrialStatus.REJECTED, TrialStatus.SURPLUS)
                and recorded(t).duplicate_of is None][-last:]
    reasons = {recorded(t).reason for t in finished}
    if (len(finished) == last and len(reasons) == 1 and None not in reasons
            and all(t.state == TrialState.FAIL and recorded(t).fail_kind == "error" for t in finished)):
        return str(reasons.pop())
    return None


def heartbeat_retries(study: optuna.Study) -> dict[int, int]:
    """{failed trial: the trial that retries it} for trials Optuna's heartbeat failed and re-queued."""
    return {stored_system(t)["failed_trial"]: t.number for t in study.get_trials(deepcopy=False)
            if "failed_trial" in stored_system(t)}


def counted_trials(study: optuna.Study) -> int:
    """Trials that count towards `--trials`: finished ones; a retried failure counts via its retry,
    a surplus trial (`is_surplus`) not at all."""
    trials = study.get_trials(deepcopy=False)
    retried = _retried(trials)
    return sum(1 for t in trials if t.state.is_finished() and _counts(t, retried))


def slots_taken(study: optuna.Study, before: float = math.inf) -> int:
    """Of the `--trials` slots, those taken by trials numbered below `before`: the counted ones and
    those still running (which may yet need a retry)."""
    trials = study.get_trials(deepcopy=False)
    retried = _retried(trials)
    return sum(1 for t in trials if t.number < before
               and (t.state == TrialState.RUNNING or (t.state.is_finished() and _counts(t, retried))))


def is_surplus(study: optuna.Study, number: int, wanted: int) -> bool:
    """Whether trial `number` is one too many: two workers that saw the last slot free at the same
    moment both start a trial; the one that Optuna numbered later finds the `wanted` slots ahead of
    it taken, is surplus and is not run."""
    return slots_taken(study, before=number) >= wanted


def _counts(trial: optuna.trial.FrozenTrial, retried: set[int]) -> bool:
    return (recorded(trial).status not in UNCOUNTED
            and not (trial.state == TrialState.FAIL and trial.number in retried))


def resampled_trials(study: optuna.Study) -> int:
    """Proposals answered without a trial's work and proposed again instead of counted: shapes the latency
    model put over the budget, and shapes the study holds already (`repeat`)."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if recorded(t).status in (TrialStatus.RESAMPLED, TrialStatus.REPEAT))


def _retried(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """Numbers of the failed trials that have a retry, queued by kdnas or by the heartbeat callback."""
    return {n for t in trials if (n := recorded(t).retry_of) is not None}  # Optuna's too (schema.migrate)


def recover(study: optuna.Study, stale_after_s: float) -> None:
    """Fail the trials of dead workers (Optuna's heartbeat on RDB storages, which also queues their
    retry; the pid and silence rules above everywhere) and queue the retries that are due."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since Optuna 2.9
        optuna.storages.fail_stale_trials(study)  # does nothing on storages without a heartbeat
    fail_stale_trials(study, stale_after_s)
    enqueue_retries(study)
