"""A trial another worker failed while this one ran it: Optuna refuses its result with a plain ValueError, which
the search tells apart by the trial's state in the study (not by the error's words) and goes on past."""

from __future__ import annotations

import optuna
import pytest

from kdnas.nas.search import _one_trial, failed_meanwhile


class _Progress:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


class _FailedByAnother:
    """An objective during whose run "another worker" marks its trial FAIL (as nas.resume does to a stale one)."""

    last_number = None

    def __call__(self, trial: optuna.Trial) -> float:
        self.last_number = trial.number
        trial.study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        return 0.5


def test_a_result_refused_because_another_worker_failed_the_trial_is_noted_and_the_search_goes_on():
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    progress = _Progress()
    _one_trial(study, _FailedByAnother(), progress)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert len(progress.notes) == 1 and "failed by another worker meanwhile" in progress.notes[0]
    assert failed_meanwhile(study, 0) and not failed_meanwhile(study, None) and not failed_meanwhile(study, 7)


def test_any_other_refusal_of_a_result_is_raised():
    class Unfailed:
        last_number = None

        def __call__(self, trial: optuna.Trial) -> float:
            self.last_number = trial.number
            raise ValueError("the objective's own error")

    study = optuna.create_study()
    progress = _Progress()
    _one_trial(study, Unfailed(), progress)  # caught by optimize(catch=...): the trial FAILs, nothing refused
    assert study.trials[0].state == optuna.trial.TrialState.FAIL and not progress.notes

    class RefusedRunning:  # a study whose optimize raises while the trial is still RUNNING in it
        def optimize(self, *args, **kwargs):
            raise ValueError("refused for another reason")

        def get_trials(self, deepcopy=False):
            return [optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)]

    objective = Unfailed()
    objective.last_number = 0
    with pytest.raises(ValueError, match="another reason"):
        _one_trial(RefusedRunning(), objective, progress)
