"""latency.fit_latency_model: a latency predicted from a shape, fitted on readings."""

import random

import numpy as np
import pytest

from kdnas.latency import Reading, Shape, fit_latency_model, kendall_tau, mape
from kdnas.latency._model import MIN_READINGS, _nnls, features

TRUE = np.array([0.8, 0.15, 12.0, 9.0, 0.02])  # ms per unit of each cost


def _shapes(n, seed=0):
    rng = random.Random(seed)
    return [Shape(rng.randint(1, 12), 12, rng.choice([128, 256, 384, 512, 768]) , rng.choice([512, 1024, 2048, 3072]))
            for _ in range(n)]


def _reading(shape, noise=0.0, rng=None):
    ms = float(features(shape) @ TRUE)
    return Reading(shape, ms * (1 + (rng.gauss(0, noise) if rng else 0.0)))


def test_exact_costs_are_recovered_and_held_out_shapes_predicted():
    train, held = _shapes(10), _shapes(8, seed=1)
    model = fit_latency_model([_reading(s) for s in train])
    assert model is not None and model.readings == len(set(train))
    for s in held:
        assert model.predict(s).ms == pytest.approx(float(features(s) @ TRUE), rel=1e-6)
    assert model.rel_error < 1e-6


def test_noisy_readings_give_an_interval_that_holds_most_held_out_shapes():
    rng = random.Random(3)
    model = fit_latency_model([_reading(s, 0.04, rng) for s in _shapes(30)])
    held = [_reading(s, 0.04, rng) for s in _shapes(40, seed=7)]
    inside = [model.predict(r.shape).low <= r.ms <= model.predict(r.shape).high for r in held]
    assert sum(inside) >= 0.8 * len(held)
    predicted = [model.predict(r.shape).ms for r in held]
    assert mape(predicted, [r.ms for r in held]) < 0.08
    assert 0.02 < model.rel_error < 0.1


def test_too_few_distinct_shapes_give_no_model_and_repeats_are_averaged():
    one = _shapes(1)[0]
    assert fit_latency_model([Reading(one, 5.0)] * 20) is None
    shapes = list(dict.fromkeys(_shapes(40)))[:MIN_READINGS]
    readings = [_reading(s) for s in shapes] + [Reading(shapes[0], 2 * _reading(shapes[0]).ms)]
    model = fit_latency_model(readings)
    assert model is not None and model.readings == MIN_READINGS


def test_nnls_never_returns_a_negative_cost():
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # falling: the unconstrained slope is negative
    coef = _nnls(x, y)
    assert (coef >= 0).all() and coef[1] == 0.0 and coef[0] == pytest.approx(2.0)


def test_more_work_is_never_predicted_faster():
    rng = random.Random(5)
    model = fit_latency_model([_reading(s, 0.1, rng) for s in _shapes(12)])
    small, large = Shape(2, 12, 384, 1024), Shape(4, 12, 384, 1024)
    assert model.predict(large).ms >= model.predict(small).ms


def test_kendall_tau_and_straddles():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    model = fit_latency_model([_reading(s) for s in _shapes(10)])
    p = model.predict(Shape(3, 12, 384, 1024))
    assert p.straddles(p.ms) and not p.straddles(p.high * 1.01) and not p.straddles(p.low * 0.99)


class _Trial:
    def __init__(self, arch, latency):
        self.user_attrs = {"arch": arch, "latency": latency}


def test_a_trial_reads_the_model_only_where_its_interval_keeps_clear_of_the_budget():
    from kdnas.core.spec import parse_arch
    from kdnas.nas import SearchConfig
    from kdnas.nas.measure import latency_prediction, model_check, predicted_latency, study_readings
    from kdnas.nas.schema import LatencyRecord

    shapes = [s for s in dict.fromkeys(_shapes(30)) if s.hidden % s.heads == 0][:10]
    trials = [_Trial(f"{s.layers}x{s.heads}x{s.hidden}x{s.ffn}", {"median_ms": _reading(s).ms}) for s in shapes]
    trials.append(_Trial("2x12x384x1024", {"median_ms": 999.0, "noisy": True}))  # a noisy reading is left out
    trials.append(_Trial("2x12x384x768", {"median_ms": 999.0, "predicted": True}))  # so is a prediction
    readings = study_readings(trials)
    assert len(readings) == len(shapes)
    cfg = SearchConfig.from_flags(teacher="minilm-l6", trials=1)
    spec = parse_arch("4x12x384x1024")
    truth = float(features(Shape.of(spec)) @ TRUE)
    assert predicted_latency(latency_prediction(spec, cfg, readings), truth) is None  # the budget inside the interval: measure
    fits = predicted_latency(latency_prediction(spec, cfg, readings), truth * 2)
    assert fits.predicted and fits.median_ms == pytest.approx(truth, rel=1e-4)
    over = predicted_latency(latency_prediction(spec, cfg, readings), truth / 2)
    assert over.median_ms > truth / 2 and over.interval_ms[0] > truth / 2
    assert predicted_latency(latency_prediction(spec, cfg, readings[:MIN_READINGS - 1]), truth * 2) is None  # no model yet
    # A shape measured because the interval held the budget keeps what the model predicted beside its reading.
    read = LatencyRecord(median_ms=truth * 1.01)
    check = model_check(read, latency_prediction(spec, cfg, readings))
    assert check.model_ms == pytest.approx(truth, rel=1e-3) and check.model_readings == len(shapes)
    assert check.model_interval_ms[0] <= check.model_ms <= check.model_interval_ms[1] and check.median_ms == read.median_ms
    assert model_check(read, latency_prediction(spec, cfg, readings[:MIN_READINGS - 1])) is read


def test_the_report_sets_the_models_predictions_beside_the_measurements():
    from kdnas.nas.plots import latency_model_figure
    from kdnas.nas.records import TrialRow, latency_model_facts

    def row(n, measured, model, predicted=False, cached=False):
        return TrialRow(number=n, arch="1x12x384x512", latency_median_ms=measured, latency_model_ms=model,
                        latency_predicted=predicted, latency_cached=cached)

    rows = [row(0, 10.0, None), row(1, 12.0, 11.0), row(2, 8.0, 8.8), row(3, 20.0, 19.0, cached=True),
            row(4, 30.0, 30.0, predicted=True),  # predicted, not measured: no check
            row(5, 12.0, None, cached=True)]  # a copy of trial 1's reading carries no check
    facts = latency_model_facts(rows)
    assert (facts.predicted, facts.checked, facts.kendall_tau) == (1, 3, 1.0)
    assert facts.mape == pytest.approx((1 / 12 + 0.1 + 0.05) / 3, abs=1e-4)
    assert facts.to_json() == {"predicted": 1, "checked": 3, "mape": facts.mape, "kendall_tau": 1.0}  # summary.json's
    fig = latency_model_figure(rows)
    assert list(fig.data[0].x) == [12.0, 8.0, 20.0] and list(fig.data[0].y) == [11.0, 8.8, 19.0]
    assert "MAPE 0.078" in fig.layout.title.text and "3 measured near the budget" in fig.layout.title.text
    empty = latency_model_figure([row(0, 10.0, None)])
    assert not empty.data and "needs six measured shapes" in empty.layout.title.text


def test_a_proposal_predicted_over_the_budget_is_proposed_again_not_counted():
    import optuna

    from kdnas.nas.resume import RESAMPLES, counted_trials, resampled_trials

    study = optuna.create_study()
    for status in ["resampled"] * 3 + ["infeasible", "feasible", "surplus"]:
        trial = study.ask()
        trial.set_user_attr("status", status)
        study.tell(trial, 1.0)
    assert resampled_trials(study) == 3
    assert counted_trials(study) == 2  # the infeasible and the feasible one
    assert RESAMPLES >= 1


def test_the_objective_resamples_predicted_overruns_up_to_its_cap_then_counts_them():
    from types import SimpleNamespace

    import optuna

    from kdnas.nas.resume import RESAMPLES
    from kdnas.nas.schema import LatencyRecord
    from kdnas.nas.trial import Objective

    from kdnas.nas import SearchConfig

    ctx = SimpleNamespace(budget_ms=10.0, config=SearchConfig.from_flags(trials=1, objective="pareto"))
    objective, study = Objective(ctx), optuna.create_study(directions=["minimize", "minimize"])
    statuses = []
    for _ in range(RESAMPLES + 1):
        trial = study.ask()
        study.tell(trial, objective._over_budget(trial, LatencyRecord(median_ms=14.0, predicted=True)))
        statuses.append(study.trials[-1].user_attrs["status"])
    assert statuses == ["resampled"] * RESAMPLES + ["infeasible"]
    trial = study.ask()
    objective._over_budget(trial, LatencyRecord(median_ms=14.0))  # a measured overrun is never resampled
    assert trial.user_attrs["status"] == "infeasible" and "latency 14.00 ms" in trial.user_attrs["reason"]


def test_a_reused_reading_leaves_the_other_trials_model_check_behind():
    """A trial of a shape another trial measured reuses the reading, not the prediction beside it: each check
    is plotted and counted once."""
    from types import SimpleNamespace

    from kdnas.nas.trial import _stored_latency

    measured = {"median_ms": 5.0, "model_ms": 4.8, "model_interval_ms": [4.0, 5.6], "model_readings": 7}
    other = SimpleNamespace(number=3, user_attrs={"arch": "2x12x384x768", "latency": measured})
    trial = SimpleNamespace(number=9, study=SimpleNamespace(get_trials=lambda deepcopy=False: [other]))
    from kdnas.nas.schema import LatencyRecord

    assert _stored_latency(trial, "2x12x384x768") == LatencyRecord(median_ms=5.0, cached=True, measured_in_trial=3)
