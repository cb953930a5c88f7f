"""The median pruner, counted over trained trials only.

Optuna's `MedianPruner(n_startup_trials=n)` starts once n trials are COMPLETE, whatever they are.
In a kdnas study many COMPLETE trials were never trained: over the budget, rejected shapes, copies
of an earlier result. They have no intermediate values, so the stock pruner could stop a trial
against the curve of a single trained one. This pruner waits for `min_trained` trials that
reported at the step in question, and never prunes before `warmup_steps`.
"""

from __future__ import annotations

import statistics

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


class TrainedMedianPruner(optuna.pruners.BasePruner):
    """Prune when the trial's last report is worse than the median of ≥ `min_trained` trained trials
    that reported at the same step (single-objective studies)."""

    def __init__(self, min_trained: int, warmup_steps: int) -> None:
        if min_trained < 1 or warmup_steps < 0:
            raise ValueError(f"min_trained={min_trained} must be ≥ 1 and warmup_steps={warmup_steps} ≥ 0")
        self.min_trained = min_trained
        self.warmup_steps = warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.warmup_steps:
            return False
        peers = [t.intermediate_values[step] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if step in t.intermediate_values]
        if len(peers) < self.min_trained:
            return False
        median = statistics.median(peers)
        value = trial.intermediate_values[step]
        return value < median if study.direction == StudyDirection.MAXIMIZE else value > median
