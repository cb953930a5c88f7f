"""The pruner counts trained trials only (real Optuna studies, no mocks)."""

from __future__ import annotations

import optuna
import pytest

from kdnas.nas.pruning import TrainedMedianPruner


def _trained(study: optuna.Study, curve: list[float]) -> None:
    trial = study.ask()
    for step, value in enumerate(curve, start=1):
        trial.report(value, step * 5)
    study.tell(trial, curve[-1])


def _verdict(study: optuna.Study, value: float, step: int = 10) -> bool:
    trial = study.ask()
    trial.report(value, step)
    return trial.should_prune()


def test_untrained_complete_trials_do_not_count():
    study = optuna.create_study(direction="maximize", pruner=TrainedMedianPruner(min_trained=3, warmup_steps=6))
    for _ in range(5):  # over budget / copied: COMPLETE, no curve
        study.tell(study.ask(), 0.0)
    _trained(study, [0.5, 0.6, 0.7])
    assert not _verdict(study, 0.1), "pruned against one trained trial"
    _trained(study, [0.5, 0.6, 0.7])
    _trained(study, [0.4, 0.5, 0.6])
    assert _verdict(study, 0.1) and not _verdict(study, 0.9)


def test_warmup_and_direction():
    study = optuna.create_study(direction="minimize", pruner=TrainedMedianPruner(min_trained=1, warmup_steps=6))
    _trained(study, [0.5, 0.4, 0.3])
    assert not _verdict(study, 9.0, step=5), "pruned inside the warm-up"
    assert _verdict(study, 0.9) and not _verdict(study, 0.1)


def test_bad_settings():
    with pytest.raises(ValueError):
        TrainedMedianPruner(min_trained=0, warmup_steps=1)
