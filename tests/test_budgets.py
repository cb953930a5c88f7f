"""Several budgets in one study (`--budget-ratio 0.5,0.25`, `--budget-ms 8,4`): the flag, the config, each
budget's candidates, folders and records, and the page that shows the students shipped for them. The whole
search with two budgets runs in tests/test_search_e2e.py (slow)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from kdnas.core.errors import InputError
from kdnas.nas import SearchConfig
from kdnas.nas._cli import budget_list
from kdnas.nas.budgets import Budget, budget_facts, study_budgets, within
from kdnas.nas.final import final_dir, finalists
from kdnas.nas.final._records import of_other_budgets
from kdnas.nas.recipe import recipe_of
from kdnas.nas.plots import students_figure
from kdnas.nas.records import budget_table, trial_rows
from kdnas.nas.schema import Fidelity, FinalRecord, LatencyRecord, Quality, StudyFacts

REPO = Path(__file__).resolve().parents[1]


def test_the_flag_takes_one_budget_or_a_comma_separated_list():
    assert budget_list("0.5") == 0.5
    assert budget_list("0.5, 0.25,0.125") == (0.5, 0.25, 0.125)
    for bad in ("0.5,abc", "", "0.5,", "8ms"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a number"):
            budget_list(bad)


def test_several_budgets_are_kept_largest_first_and_a_bad_one_is_refused():
    cfg = SearchConfig.from_flags(budget_ratio=(0.25, 0.5))
    assert cfg.budget_ratio == (0.5, 0.25) and cfg.budgets == (0.5, 0.25) and cfg.several_budgets
    one = SearchConfig.from_flags(budget_ratio=(0.5,))
    assert one.budget_ratio == 0.5 and one.budgets == (0.5,) and not one.several_budgets  # one stays a number
    assert SearchConfig.from_flags(budget_ms=(2, 8, 4)).budgets == (8.0, 4.0, 2.0)
    for bad, match in (((0.5, 0.0), "budget ratio 0.0 must be a positive"), ((0.5, 0.5), "given twice"),
                       ((0.5, float("nan")), "budget ratio nan"), ((0.5, True), "budget ratio True")):
        with pytest.raises(InputError, match=match):
            SearchConfig.from_flags(budget_ratio=bad)
    with pytest.raises(InputError, match="budget -4 ms must be a positive"):
        SearchConfig.from_flags(budget_ms=(8, -4))


def test_the_budgets_are_study_settings_so_a_resume_with_another_list_is_refused():
    from kdnas.nas.space import default_space

    space = default_space(6, 12, 384, 1536, keep_head_size=True)
    two = SearchConfig.from_flags(budget_ratio=(0.5, 0.25)).study_settings(space, "fp")
    assert two["budget_ratio"] == (0.5, 0.25)
    assert two != SearchConfig.from_flags(budget_ratio=(0.5, 0.125)).study_settings(space, "fp")
    assert SearchConfig.from_flags(budget_ratio=0.5).study_settings(space, "fp")["budget_ratio"] == 0.5  # as before


def test_each_budget_is_labelled_by_what_was_asked_and_a_single_budget_keeps_its_folders():
    ratios = budget_facts(SearchConfig.from_flags(budget_ratio=(0.5, 0.25)), (10.0, 5.0))
    assert ratios == [{"label": "0.5x", "ms": 10.0}, {"label": "0.25x", "ms": 5.0}]
    assert budget_facts(SearchConfig.from_flags(budget_ms=(8, 4)), (8.0, 4.0))[1] == {"label": "4ms", "ms": 4.0}
    assert budget_facts(SearchConfig(), (10.0,)) == []  # one budget: the study's facts as before
    budgets = study_budgets(StudyFacts(budget_ms=10.0, budgets=ratios))
    assert budgets == [Budget(10.0, "0.5x"), Budget(5.0, "0.25x")]
    assert study_budgets(StudyFacts(budget_ms=10.0)) == [Budget(10.0)]
    assert [b.best for b in budgets] == ["best-0.5x", "best-0.25x"] and Budget(10.0).best == "best"
    out = Path("runs/x")
    assert final_dir(out, 1, "3x12x384x1536") == out / "best"
    assert final_dir(out, 1, "3x12x384x1536", "0.25x") == out / "best-0.25x"
    assert final_dir(out, 2, "3x12x384x1536", "0.25x") == out / "finalists" / "0.25x" / "2-3x12x384x1536"


def _study(trials: list[tuple[float, float, str]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for number, (reward, ms, status) in enumerate(trials):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=reward, params={"layers": number + 1},
            distributions={"layers": IntDistribution(1, 6)},
            user_attrs={"arch": f"{number + 1}x12x384x1536", "status": status, "loss": 1 - reward, "reward": reward,
                        "latency": {"median_ms": ms}}))
    return study


def test_every_trial_is_a_candidate_for_every_budget_it_fits():
    # (reward, latency ms, status): the best trial fits only the larger budget; trial 3 fits neither
    study = _study([(0.80, 9.0, "feasible"), (0.70, 4.0, "feasible"), (0.75, 5.5, "feasible"), (0.0, 12.0, "infeasible")])
    large, small = Budget(10.0, "0.5x"), Budget(5.0, "0.25x")
    assert [r.number for r in finalists(study, "reward", large)] == [0, 2, 1]
    assert [r.number for r in finalists(study, "reward", small)] == [1]
    assert [r.number for r in finalists(study, "reward")] == [0, 2, 1]  # one budget: every trained trial
    assert [r.number for r in within(trial_rows(study), small)] == [1]
    table = budget_table(StudyFacts(budget_ms=10.0, budgets=[{"label": "0.5x", "ms": 10.0}, {"label": "0.25x", "ms": 5.0}],
                                    final=[FinalRecord(trial=1, arch="2x12x384x1536", dir="best-0.25x", latency_ms=4.0,
                                                       recipe={"budget": "0.25x"}).to_attrs()]), trial_rows(study))
    assert [(t.label, t.trials_within, t.best_trial, [f.arch for f in t.final]) for t in table] == [
        ("0.5x", (0, 1, 2), 0, []), ("0.25x", (1,), 1, ["2x12x384x1536"])]


def test_each_budget_keeps_its_own_records_and_a_single_budget_replaces_an_old_recipes():
    cfg = SearchConfig()
    assert "budget" not in recipe_of(cfg) and recipe_of(cfg, "0.25x")["budget"] == "0.25x"
    records = [{"arch": "a", "recipe": recipe_of(cfg, "0.5x")}, {"arch": "b", "recipe": recipe_of(cfg, "0.25x")}]
    assert [r["arch"] for r in of_other_budgets(records, "0.25x")] == ["a"]
    old = [{"arch": "c", "recipe": recipe_of(cfg.with_flags(final_steps=7))}]
    assert of_other_budgets(old, None) == []  # a single budget's records are all its own


def test_the_students_figure_draws_each_shipped_student_its_int8_graph_its_baselines_and_the_teacher_both_ways():
    final = FinalRecord(trial=1, arch="2x12x384x1536", budget="0.25x", dir="runs/x/best-0.25x", latency_ms=4.1,
                        latency_fp32_onnx={"median_ms": 4.1}, latency_int8_onnx={"median_ms": 2.2},
                        quality=Quality(fidelity={"student": Fidelity(0.85), "first 2 layers (untrained)": Fidelity(0.4),
                                                  "inherited, untrained": Fidelity(0.5)}, int8=Fidelity(0.84)))
    facts = StudyFacts.from_attrs({  # as the study stores them
        "teacher_latency": {"median_ms": 16.0}, "final": [final.to_attrs()], "settings": {}, "budget_ms": 8.0,
        "teacher_int8": {"latency": {"median_ms": 11.0}, "fidelity": {"spearman": 0.99}, "sentences": 1000},
        "budgets": [{"label": "0.5x", "ms": 8.0}, {"label": "0.25x", "ms": 4.0}]})
    fig = students_figure(facts)
    points = {trace.name.split(" (")[0]: list(zip(trace.x, trace.y)) for trace in fig.data}
    assert points["teacher, fp32"] == [(16.0, 1.0)] and points["teacher, INT8"] == [(11.0, 0.99)]
    assert points["shipped student, model.onnx"] == [(4.1, 0.85)]
    assert points["shipped student, model.int8.onnx"] == [(2.2, 0.84)]
    assert sorted(points["its untrained baselines"]) == [(4.1, 0.4), (4.1, 0.5)]
    assert len(fig.layout.shapes) == 2  # a line at each budget
    empty = students_figure(StudyFacts(teacher_latency=LatencyRecord(median_ms=16.0), settings={}, budget_ms=8.0))
    assert "no student shipped yet" in empty.layout.annotations[-1].text


@pytest.mark.parametrize("flag, value, says", [
    ("--budget-ratio", "0.5,abc", "'abc' is not a number"),
    ("--budget-ratio", "0", "budget ratio 0.0 must be a positive number"),
    ("--budget-ms", "8,8", "a budget is given twice"),
])
def test_a_bad_budget_list_is_one_line_exit_2_and_nothing_written(tmp_path, flag, value, says):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kdnas.cli", "search", flag, value, "--out", str(out)], cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_finalist_record_is_the_json_search_json_the_card_and_the_summary_read():
    from kdnas.nas import Scored
    from kdnas.nas.final._records import Finalist
    from kdnas.nas.schema import LatencyRecord

    scored = Scored(arch="2x12x768x1536", params=10, latency=LatencyRecord(median_ms=7.5), loss=0.2, loss_se=0.01, fidelity=0.8,
                    l_hs_norm=0.3, l_hs_raw=0.1, l_hs_se=0.01, reward=0.7, within_budget=True)
    finalist = Finalist(trial=3, scored=scored, dir="runs/x/best-0.25x", recipe={"budget": "0.25x"}, budget_ms=8.0,
                        budget="0.25x", run={"steps": 100, "steps_planned": 1200}, latency={"budget_graph": "model.onnx",
                        "ratio_to_teacher": 0.12}, quality=None, shipped={"export": {}}, proxy_reward=0.6,
                        origin={"neighbour_of": "2x12x768x1024"}, seconds={"distill": 1.0})
    record = finalist.record()
    assert finalist.within_budget and finalist.latency_ms == 7.5 == record.latency_ms
    assert (record.trial, record.arch, record.steps, record.budget, record.ratio_to_teacher, record.neighbour_of,
            record.reward) == (3, "2x12x768x1536", 100, "0.25x", 0.12, "2x12x768x1024", 0.7)
    import json

    stored = json.loads(json.dumps(record.to_attrs()))  # plain JSON, as the study stores it
    assert FinalRecord.from_attrs(stored) == record
    with pytest.raises(TypeError, match="unexpected keyword argument 'latency_p95_ms'"):  # no fact goes unread
        replace(finalist, latency={"latency_p95_ms": 7.9}).record()


def test_a_rule_shape_over_its_budget_queues_the_next_shallower_full_width_one():
    """The rule as a user with a stopwatch applies it (nas.trial.Objective._rule_fallback): each budget's
    rule trial carries the smallest budget it stands for; over it, the shape one layer shallower follows."""
    from types import SimpleNamespace

    from kdnas.nas.search import _create_study
    from kdnas.nas.space import SearchSpace
    from kdnas.nas.trial import Objective

    cfg = SearchConfig.from_flags(budget_ratio=(0.5, 0.25), sampler="random")
    rules = [{"layers": 6, "hidden": 768, "ffn": 3072}, {"layers": 3, "hidden": 768, "ffn": 3072}]
    facts = StudyFacts(budget_ms=43.0, budgets=[{"label": "0.5x", "ms": 43.0}, {"label": "0.25x", "ms": 21.5}],
                       rules=rules, rule=rules[0])
    study = _create_study(cfg, None, facts)
    queued = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert [(t.system_attrs["fixed_params"]["layers"], t.user_attrs["rule_budget_ms"]) for t in queued] == [(6, 43.0), (3, 21.5)]

    space = SearchSpace(layers=(1, 2, 3, 4, 5, 6), heads=(12,), hidden=(384, 768), ffn=(1536, 3072), head_size=64)
    objective = Objective.__new__(Objective)
    objective.ctx = SimpleNamespace(space=space, budget_ms=43.0, tolerance=0.0)
    # the 6 layers fit 0.5x (the 3 wait their turn); the 3 read over 0.25x: the 2 follow
    for median_ms, expect in ((40.0, [(3, 21.5)]), (21.9, [(2, 21.5)])):
        trial = study.ask()
        space.suggest(trial)
        objective._rule_fallback(trial, median_ms)
        study.tell(trial, 0.5)
        waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
        assert [(t.system_attrs["fixed_params"]["layers"], t.user_attrs["rule_budget_ms"]) for t in waiting] == expect


def test_budgets_where_the_teachers_plan_fits_train_last_on_the_time_the_others_leave():
    """nas.search.final_order: a budget whose teacher plan fits (its student must beat a graph that needs no
    training) trains after the others, which share the time among themselves only."""
    from types import SimpleNamespace

    from kdnas.nas.search import final_order

    from kdnas.nas.schema import TeacherPlanRow, TeacherPlans

    plans = StudyFacts(teacher_plans=TeacherPlans((
        TeacherPlanRow("0.6x", 6.0, True, {}), TeacherPlanRow("0.5x", 5.0, True, {}),
        TeacherPlanRow("0.35x", 3.5, False), TeacherPlanRow("0.25x", 2.5, False))))
    todo = [(SimpleNamespace(budget_label=label), label) for label in ("0.6x", "0.5x", "0.35x", "0.25x")]
    # the first two leave the last two their work after training (`trailing`), not a share of the training time
    assert [(chosen, later, trailing) for _, chosen, later, trailing in final_order(todo, plans, 1)] == [
        ("0.35x", 1, 2), ("0.25x", 0, 2), ("0.6x", 1, 0), ("0.5x", 0, 0)]
    # no teacher plans (another runtime, or none fits): largest budget first, each sharing with those after it
    assert [(chosen, later, trailing) for _, chosen, later, trailing in final_order(todo, StudyFacts(), 2)] == [
        ("0.6x", 6, 0), ("0.5x", 4, 0), ("0.35x", 2, 0), ("0.25x", 0, 0)]
