"""What a study holds, by name: the statuses a trial ends in, and the version of the record a study was written in.

A study is read by later versions of kdnas (a rerun resumes it, `kdnas report` rebuilds its pages), so each new
study stores SCHEMA_VERSION; a study of a newer version than this kdnas reads is refused in one line rather than
misread. Statuses are stored as their plain strings (JSON), and compare equal to them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from kdnas.core.errors import StorageError

# 1: every study before the version was stored; 2: precision plans (a trial's `precision`, `latency_int8`),
# the budget's tolerance, a repeated shape's status.
SCHEMA_VERSION = 2
VERSION_ATTR = "kdnas_schema"


class TrialStatus(str, Enum):
    """How a trial ended, in `trials.csv`'s `status` column and a trial's `status` attribute."""

    FEASIBLE = "feasible"  # trained and scored within the budget
    INFEASIBLE = "infeasible"  # over the budget: not trained
    REJECTED = "rejected"  # an invalid shape, or one that failed twice
    RESAMPLED = "resampled"  # predicted over the budget: not measured, proposed again, not counted
    REPEAT = "repeat"  # a shape the study holds: answered from it, proposed again, not counted
    SURPLUS = "surplus"  # one trial too many (two workers took the last slot): not run
    PRUNED = "pruned"  # stopped by the pruner
    FAILED = "failed"  # an error, or its worker died
    RUNNING = "running"  # (a row's status while its trial runs, from Optuna's state)
    WAITING = "waiting"  # (queued)

    __hash__ = str.__hash__  # a row's plain string finds its status in a dict keyed by the enum

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# The normalized loss a trial never trained is stored with (predicting the teacher's mean): its constraints
# make it infeasible, so neither samplers nor `best` use it; pages draw it at this loss.
UNTRAINED_LOSS = 1.0
# Settled before any training: what the share of trials "rejected before training" counts.
BEFORE_TRAINING = (TrialStatus.REJECTED, TrialStatus.INFEASIBLE, TrialStatus.RESAMPLED)
# Proposals that count for nothing towards --trials.
UNCOUNTED = (TrialStatus.SURPLUS, TrialStatus.RESAMPLED, TrialStatus.REPEAT)


def check_version(attrs: dict[str, Any], where: str) -> None:
    """Refuse a study written by a newer kdnas than this one (its records may mean something else)."""
    version = attrs.get(VERSION_ATTR, 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StorageError(f"{where} holds a study of kdnas record version {version!r}; this kdnas reads versions up "
                           f"to {SCHEMA_VERSION}: upgrade kdnas, or give another --study-name")
