"""`--timeout`: a run fitted to a deadline (distill.loop.StepPlan) and the search's split of the time
(nas.time_limit)."""

from __future__ import annotations

import time

import pytest
import torch

from kdnas.distill.loop import FIT_AFTER, REFIT_EVERY, Optimization, StepPlan, fit_steps, train_steps, warmup_linear_decay
from kdnas.nas import SearchConfig
from kdnas.nas.final import MIN_CONTINUED_STEPS
from kdnas.nas.records import steps_label
from kdnas.nas.time_limit import (FINAL_OVERHEAD_TRIALS, FIRST_TRIALS, MARGIN, PLANS_SHARE, STEPS_AFTER, TRIAL_SHARE,
                                  TimeLimit,
                            after_training_s, fallback_s, final_run_s, marginal, pace_of, settled)


@pytest.mark.parametrize("done, pace, left, planned, expected", [
    (20, 0.25, 100.0, 1200, 420),    # 400 more fit
    (20, 0.25, 1000.0, 1200, 1200),  # all fit: never more than planned
    (20, 0.25, -5.0, 1200, 20),      # the deadline has passed: stop now
    (70, 0.5, 0.2, 1200, 70),        # not even one more
    (20, 0.25, 1000.0, 2400, 2400),  # time to spare: up to the most the run may make
    (20, 0.25, 500.0, 2400, 2020),   # and no further than the time allows
])
def test_fit_steps(done, pace, left, planned, expected):
    assert fit_steps(done, pace, left, planned) == expected


def test_a_plan_refits_only_at_its_checkpoints_and_follows_the_measured_pace():
    plan = StepPlan(1200, until=1000.0)
    plan.started = 0.0
    plan.after(FIT_AFTER - 1, now=5.0)
    assert plan.total == 1200 and not plan.fitted  # too early to judge the pace
    plan.after(FIT_AFTER, now=10.0)  # 0.5 s per step, 990 s left: 1,980 more would fit
    assert plan.total == 1200
    plan.after(FIT_AFTER + 1, now=900.0)  # between checkpoints: nothing changes
    assert plan.total == 1200
    step = FIT_AFTER + REFIT_EVERY
    plan.after(step, now=700.0)  # the host slowed: 10 s per step, 300 s left
    assert plan.total == step + 30 and plan.fitted
    unlimited = StepPlan(50)
    unlimited.after(FIT_AFTER, now=time.monotonic() + 1e6)
    assert unlimited.total == 50 and not unlimited.fitted


def test_a_plan_with_time_to_spare_goes_past_its_planned_steps_up_to_its_most():
    plan = StepPlan(1200, until=1000.0, most=2400)
    plan.started = 0.0
    plan.after(FIT_AFTER, now=10.0)  # 0.5 s per step, 990 s left: 1,980 more would fit
    assert plan.total == FIT_AFTER + 1980 and plan.extended and not plan.fitted
    plan.after(FIT_AFTER + REFIT_EVERY, now=21.0)  # faster (0.3 s per step): capped at the most
    assert plan.total == 2400
    step = FIT_AFTER + 2 * REFIT_EVERY
    plan.after(step, now=900.0)  # the host slowed to 7.5 s per step: back below the plan
    assert plan.total == step + 13 and plan.fitted and not plan.extended
    assert StepPlan(1200, until=1000.0, most=600).most == 1200  # a most below the plan is the plan
    free = StepPlan(1200, most=2400)  # no deadline: no reason to train more
    free.after(FIT_AFTER, now=time.monotonic() + 1.0)
    assert free.total == 1200


def test_a_cut_schedule_still_warms_up_and_decays_to_zero_at_its_last_step():
    plan = StepPlan(1200)
    factor = warmup_linear_decay(lambda: plan.total, warmup_steps=60)
    assert factor(0) == pytest.approx(1 / 60) and factor(60) == pytest.approx(1.0)
    plan.total = 40  # cut below the warm-up: it is held to half the steps
    assert factor(19) == pytest.approx(1.0) and factor(40) == 0.0
    assert all(factor(s) <= 1.0 for s in range(40))
    fixed = warmup_linear_decay(100, warmup_steps=10)  # a run without a deadline, as before
    assert fixed(9) == pytest.approx(1.0) and fixed(100) == 0.0


def test_a_run_past_its_deadline_stops_after_measuring_its_pace_with_the_lr_at_zero():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    params = list(model.parameters())
    optim = Optimization(lr=1e-2, steps=500, warmup_steps=25, weight_decay=0.0)
    plan = StepPlan(500, until=time.monotonic() - 1.0)
    drawn = []

    def batches():
        while True:
            drawn.append(1)
            yield torch.randn(8, 4)

    steps = [s for s, _ in train_steps(params, batches(), lambda b: model(b).pow(2).mean(), optim,
                                       torch.device("cpu"), "fp32", plan)]
    assert steps == list(range(1, FIT_AFTER + 1)) and plan.total == FIT_AFTER and plan.fitted
    assert len(drawn) == FIT_AFTER  # no batch drawn past the last update


def test_the_search_splits_its_time_between_trials_and_the_final_run():
    limit = TimeLimit(started=100.0, seconds=600.0)
    assert limit.trials_may_start(done=3, now=100.0 + TRIAL_SHARE * 600 - 1)
    assert not limit.trials_may_start(done=3, now=100.0 + TRIAL_SHARE * 600)
    assert limit.trials_may_start(done=0, now=10_000.0)  # one trial always runs
    after = after_training_s(step_s=4.0, baselines_s=12.0)
    assert after == STEPS_AFTER * 4.0 + 8.0
    assert limit.final_until(after, now=400.0) == pytest.approx(700.0 - after)
    # two finalists left share the time, each with what follows its run (and the second, what comes before it)
    # set aside: the first ends half-way through what is left to train
    assert limit.final_until(after, finalists_left=2, now=400.0) == pytest.approx(400.0 + (300.0 - 2 * after) / 2)
    assert limit.final_until(after, finalists_left=2, now=400.0, before_s=12.0) == pytest.approx(
        400.0 + (300.0 - 2 * after - 12.0) / 2)
    assert limit.final_until(after, now=400.0, before_s=12.0) == pytest.approx(700.0 - after)  # none after it
    # one after it that takes no share of the training time (a budget the teacher's plan fits): its work is kept
    assert limit.final_until(after, now=400.0, before_s=12.0, trailing=1) == pytest.approx(700.0 - 2 * after - 12.0)


def test_the_teachers_plan_grows_before_the_trials_only_where_it_ends_within_its_share():
    limit = TimeLimit(started=100.0, seconds=300.0)
    assert limit.plans_before_trials(40.0, now=130.0)  # ends at 70 s of 300
    assert not limit.plans_before_trials(85.0, now=170.0)  # ends at 155 s: as the slow host's run that ended at 366 s
    assert limit.plans_before_trials(PLANS_SHARE * 300.0 - 30.0, now=130.0)
    assert not limit.plans_before_trials(PLANS_SHARE * 300.0 - 29.0, now=130.0)
    assert PLANS_SHARE < TRIAL_SHARE  # the first trial still starts within the trials' share


def test_the_final_runs_forecast_and_whether_a_trial_still_leaves_it_its_time():
    # An fp32 demo on 2 cores: 0.265 s per step of the shipped shape, trials of 25 s, 1,200 planned steps.
    final = final_run_s(steps=1200, step_s=0.265, trial_s=25.0)
    assert final == pytest.approx(1200 * 0.265 + FINAL_OVERHEAD_TRIALS * 25.0)
    limit = TimeLimit(started=0.0, seconds=570.0)
    assert limit.keeps_final_run(final, trial_s=25.0, now=570.0 - final - 25.0)
    assert not limit.keeps_final_run(final, trial_s=25.0, now=570.0 - final - 24.0)


def _demo_like_study(best_step_s: float, trials: int = FIRST_TRIALS):
    """An in-memory study holding `trials` trained trials as the Objective records them: trial 0 the
    best (its pace `best_step_s`), the others slower per step and worse, 25 s each (trial 0: 70 s)."""
    import optuna

    study = optuna.create_study(direction="maximize")
    for number in range(trials):
        attrs = {"status": "feasible", "arch": f"{number + 1}x12x384x1024", "reward": 0.7 - 0.01 * number,
                 "loss": 0.3, "step_s": best_step_s * (1 + number), "seconds": {"total": 70.0 if number == 0 else 25.0}}
        study.add_trial(optuna.trial.create_trial(value=attrs["reward"], user_attrs=attrs))
    return study


@pytest.mark.parametrize("spent, done, proxy, starts", [
    (200.0, FIRST_TRIALS, "fidelity", False),     # 200 + 25 + 1200 x 0.302 + 3 x 25 > 570: the final run keeps its steps
    (100.0, FIRST_TRIALS, "fidelity", True),      # 100 + 25 + 437 <= 570: room for another trial
    (200.0, FIRST_TRIALS - 1, "fidelity", True),  # the sampler's random start always runs
    (200.0, FIRST_TRIALS, "hs", True),            # the hs proxy's pace is not the final recipe's: no forecast
    (290.0, FIRST_TRIALS, "hs", False),           # past TRIAL_SHARE: no trial whatever the proxy
])
def test_a_trial_starts_only_while_the_final_run_keeps_its_planned_steps(spent, done, proxy, starts, capsys):
    from types import SimpleNamespace

    from kdnas.nas._progress import Progress
    from kdnas.nas.search import _trial_fits

    cfg = SearchConfig.from_flags(timeout=570, proxy=proxy, final_steps=1200, trials=8)
    limit = TimeLimit(started=time.monotonic() - spent, seconds=570.0)
    space = _minilm_space(cfg)
    ctx = SimpleNamespace(config=cfg, space=space, progress=Progress(8, 0, False), cache=None)
    assert _trial_fits(_demo_like_study(best_step_s=0.265), ctx, limit, done) is starts
    said = capsys.readouterr().err
    if not starts and proxy == "fidelity":  # 1200 steps at the wider neighbour's pace (1.138 x 0.265 s) + 3 x 25 s
        assert f"so that the final run keeps its 1200 steps (about 437 s at the trials' pace; {done} of 8 done" in said
    assert bool(said) is not starts


@pytest.mark.parametrize("spent, teacher_s, done, starts", [
    (800.0, 0.0, 12, True),     # under a quarter of the hour
    (1000.0, 0.0, 12, False),   # over it
    (1000.0, 480.0, 12, True),  # over it only with the teacher's one-time targets, which do not count
    (1000.0, 0.0, 5, True),     # fewer than the default 8 trials: they run whatever the time
])
def test_without_a_trial_count_the_trials_follow_the_time(spent, teacher_s, done, starts, capsys):
    """`--timeout` without `--trials`: trials go on while less than a quarter of the time is spent, the
    teacher's one-time targets left out, and at least the default eight run."""
    from types import SimpleNamespace

    from kdnas.nas._progress import Progress
    from kdnas.nas.config import DEFAULT_TRIALS, TIMED_TRIALS_CAP
    from kdnas.nas.search import _trial_fits

    cfg = SearchConfig.from_flags(timeout=3600)
    assert cfg.trials_follow_time and cfg.trial_count == TIMED_TRIALS_CAP
    assert SearchConfig().trial_count == DEFAULT_TRIALS and not SearchConfig.from_flags(timeout=3600, trials=8).trials_follow_time
    limit = TimeLimit(started=time.monotonic() - spent, seconds=3600.0)
    ctx = SimpleNamespace(config=cfg, space=_minilm_space(cfg), progress=Progress(None, 0, False),
                          cache=SimpleNamespace(pass_seconds=teacher_s))
    assert _trial_fits(_demo_like_study(best_step_s=0.265), ctx, limit, done) is starts
    said = capsys.readouterr().err
    assert ("25% of it (less the teacher's one-time targets) is spent on trials" in said) is not starts


def test_a_rerun_of_a_study_whose_trials_followed_the_time_resumes_it_at_the_count_they_reached():
    import optuna

    from kdnas.nas._progress import Progress
    from kdnas.nas.schema import record_fact
    from kdnas.nas.search import _trials_reached

    study, cfg = optuna.create_study(), SearchConfig.from_flags(timeout=3600)
    assert _trials_reached(study, cfg, Progress(None, 0, False)) is cfg  # a first run: the time decides
    record_fact(study, "trials_reached", 37)
    assert _trials_reached(study, cfg, Progress(None, 0, False)).run.trials == 37
    assert _trials_reached(study, cfg.with_flags(trials=50), Progress(None, 0, False)).run.trials == 50  # asked for more


def _minilm_space(cfg: SearchConfig, **overrides):
    from types import SimpleNamespace

    from kdnas.nas.space import SearchSpace

    space = cfg.resolve_space(SimpleNamespace(layers=6, heads=12, hidden=384, ffn=1536))
    return SearchSpace(**{**{d: getattr(space, d) for d in ("layers", "hidden", "ffn")}, "heads": (),
                          "head_size": space.head_size, **overrides})


def test_the_forecast_runs_at_the_pace_of_the_wider_neighbour_the_final_stage_may_ship():
    from kdnas.nas.search import _final_forecast

    cfg = SearchConfig.from_flags(timeout=570, proxy="fidelity", final_steps=1200, trials=8)
    study = _demo_like_study(best_step_s=0.265)  # the best trial: 1x12x384x1024
    wider = pace_of(0.265, "1x12x384x1024", "1x12x384x1280", cfg.proxy.seq_len)
    assert wider == pytest.approx(0.265 * 1.138, rel=1e-3)  # FLOPs per sequence of 64 tokens
    assert _final_forecast(study, cfg, _minilm_space(cfg)) == pytest.approx((final_run_s(1200, wider, 25.0), 25.0))
    # no wider FFN in the space: the best trial's own pace
    narrow = _minilm_space(cfg, ffn=(256, 512, 1024))
    assert _final_forecast(study, cfg, narrow) == pytest.approx((final_run_s(1200, 0.265, 25.0), 25.0))


def test_a_finalist_at_the_budgets_edge_leaves_time_for_the_candidate_after_it():
    # the demo's refused finalist: 11.49 ms over a budget of 11.47, fitted at 11.24 on a second reading
    assert marginal(11.24, 11.47, read_twice=True)
    assert marginal(11.0, 11.47, read_twice=False)  # 4 % under: within MARGIN
    assert not marginal((1 - MARGIN) * 11.47 - 0.01, 11.47, read_twice=False)
    assert not marginal(9.3, 11.47, read_twice=False)
    after = after_training_s(step_s=4.0, baselines_s=12.0)
    # the next candidate: its graph timed beside its parent's, its proxy, its baselines, what follows it
    assert fallback_s(after, step_s=4.0, baselines_s=12.0, proxy_s=14.0) == 3 * 4.0 + 14.0 + 12.0 + after
    # and the fewest steps a refused run is continued with, at its trial's pace (else it ships untrained)
    assert fallback_s(after, 4.0, 12.0, 14.0, continued_s=MIN_CONTINUED_STEPS * 0.3) == pytest.approx(
        3 * 4.0 + 14.0 + 12.0 + after + 30.0)
    limit = TimeLimit(started=100.0, seconds=600.0)
    reserved = after + fallback_s(after, 4.0, 12.0, 14.0)
    assert limit.final_until(reserved, now=400.0) == pytest.approx(limit.final_until(after, now=400.0) - 38.0 - after)


def test_a_reading_within_the_margin_is_read_again_and_the_two_averaged():
    calls = []

    def again(ms):
        return lambda: calls.append(ms) or ms

    # MPNet's 6x12x768x3072 read 57.75 ms against 60.70 (0.951): read again, counted as the mean
    assert settled(57.75, 60.70, again(55.0)) == (pytest.approx(56.375), [57.75, 55.0])
    assert not marginal(56.375, 60.70, read_twice=False)  # no fallback's time set aside for it
    # a second reading over the budget can refuse it before its training, not after
    assert settled(58.0, 60.70, again(64.0))[0] > 60.70
    assert calls == [55.0, 64.0]
    # outside the margin, under it or over the budget, a reading stands as read
    assert settled(50.0, 60.70, again(0.0)) == (50.0, []) and settled(61.0, 60.70, again(0.0)) == (61.0, [])
    assert settled((1 - MARGIN) * 60.70, 60.70, again(0.0)) == ((1 - MARGIN) * 60.70, [])
    assert calls == [55.0, 64.0]


def test_the_summary_says_when_the_timeout_cut_the_final_run():
    from kdnas.nas.schema import FinalRecord

    def label(**run) -> str:
        return steps_label(FinalRecord(trial=0, arch="3x12x384x1536", dir="best", latency_ms=3.0, **run))

    assert label(steps=1200, steps_planned=1200, timeout_s=570.0) == "1200 steps"
    assert label(steps=1200) == "1200 steps"  # a record from before --timeout
    assert label(steps=1043, steps_planned=1200, timeout_s=570.0) == "1043 of 1200 steps (fitted to --timeout 570 s)"
    assert (label(steps=2011, steps_planned=1200, timeout_s=570.0)
            == "2011 steps (1200 planned, more in the time --timeout 570 s left)")


def test_the_final_run_may_go_past_final_steps_only_under_a_timeout():
    from kdnas.core.errors import InputError

    assert SearchConfig().final_most == 1200  # no time limit: the same work on every host
    assert SearchConfig.from_flags(timeout=570).final_most == 12000  # the default: ten times final_steps
    assert SearchConfig.from_flags(timeout=570).final.rows_for(12000) == 76800  # at five passes: the news corpus holds 79,148
    assert SearchConfig.from_flags(timeout=570, final_max_steps=1200).final_most == 1200  # never more
    assert SearchConfig.from_flags(timeout=570, final_steps=300, final_max_steps=900).final_most == 900
    with pytest.raises(InputError, match=r"final_max_steps=2400 needs a timeout"):
        SearchConfig.from_flags(final_max_steps=2400)
    for bad in (600, 1200.5, True):
        with pytest.raises(InputError, match=r"final_max_steps=.* must be a whole number of steps, at least final_steps"):
            SearchConfig.from_flags(timeout=570, final_max_steps=bad)


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), float("inf"), "ten", True])
def test_a_bad_timeout_is_refused(bad):
    from kdnas.core.errors import InputError

    with pytest.raises(InputError, match=r"timeout .* must be a positive number of seconds"):
        SearchConfig.from_flags(timeout=bad)


def test_the_timeout_does_not_define_the_study():
    from kdnas.nas.config import FLAGS

    assert FLAGS["timeout"] == ("run", "timeout") and FLAGS["final_max_steps"] == ("final", "max_steps")


def test_distill_fitted_to_a_deadline_evaluates_at_its_last_step(teacher, small_data):
    from kdnas.distill import DistillConfig, TeacherCache, distill, parse_arch

    spec = parse_arch("2x4x128x256", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=200, batch_size=8, eval_every=100, progress=False)
    result = distill(spec, teacher, small_data, config, cache=TeacherCache(teacher, small_data), until=time.monotonic())
    assert result.steps == FIT_AFTER and result.cut_short and result.summary()["steps"] == FIT_AFTER
    assert [h["step"] for h in result.history] == [FIT_AFTER]  # the last step's full evaluation


def test_distill_with_time_to_spare_trains_up_to_its_most_and_evaluates_at_its_last_step(teacher, small_data):
    from kdnas.distill import DistillConfig, TeacherCache, distill, parse_arch

    spec = parse_arch("2x4x128x256", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=FIT_AFTER, batch_size=8, eval_every=100, progress=False)
    result = distill(spec, teacher, small_data, config, cache=TeacherCache(teacher, small_data),
                     until=time.monotonic() + 600.0, up_to=FIT_AFTER + 10)
    assert result.steps == FIT_AFTER + 10 and result.extended and not result.cut_short
    assert [h["step"] for h in result.history] == [FIT_AFTER + 10]


def test_a_run_with_time_to_spare_grows_its_transfer_set_and_draws_the_new_rows(teacher, news_texts):
    from kdnas.distill import DistillConfig, TeacherCache, distill, make_transfer_set, parse_arch

    def rows(n: int):
        return make_transfer_set(teacher.tokenizer, news_texts, seq_len=32, num_train=n, num_eval=8, seed=0,
                                 unit="sentence")

    small = TeacherCache(teacher, rows(16))
    asked, drawn = [], []

    def grow(total: int):
        asked.append(total)
        if len(asked) > 1:
            return None  # enough rows already
        cache = small.grown(rows(64))
        real = cache.batch
        cache.batch = lambda split, index, *a, **k: drawn.append(int(index.max())) or real(split, index, *a, **k)
        return cache

    spec = parse_arch("1x4x128x256", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=FIT_AFTER, batch_size=8, eval_every=100, progress=False)
    result = distill(spec, teacher, small.data, config, cache=small, until=time.monotonic() + 600.0,
                     up_to=FIT_AFTER + 30, grow=grow)
    assert asked == [FIT_AFTER + 30] and result.steps == FIT_AFTER + 30 and result.rows == 64
    assert max(drawn) >= 16  # after the pass that was running, batches come from the grown set
    unlimited = distill(spec, teacher, small.data, config, cache=small, grow=grow)  # no deadline: no growth
    assert unlimited.steps == FIT_AFTER and unlimited.rows == 16 and len(asked) == 1


def test_the_forecast_leaves_out_the_one_time_teacher_work_a_trial_did_first():
    """The first trained trial of an MPNet search spent 480 of its 592 s on the teacher's targets; counted as
    the typical trial, it stopped the search after six trials. The teacher's share is not a trial's pace."""
    import optuna

    from kdnas.nas.search import _final_forecast

    cfg = SearchConfig.from_flags(timeout=3600, proxy="fidelity", final_steps=1200, trials=20)
    study = optuna.create_study(direction="maximize")
    attrs = {"status": "feasible", "arch": "1x12x384x1536", "reward": 0.5, "loss": 0.5, "step_s": 0.5,
             "seconds": {"total": 592.0, "distill": 560.0, "teacher": 480.0}}
    study.add_trial(optuna.trial.create_trial(value=0.5, user_attrs=attrs))
    assert _final_forecast(study, cfg, _minilm_space(cfg))[1] == pytest.approx(112.0)


def test_a_shape_scored_twice_is_one_finalist():
    import optuna

    from kdnas.nas.final import finalists

    study = optuna.create_study(direction="maximize")
    for number, extra in ((0, {}), (1, {"duplicate_of": 0})):
        attrs = {"status": "feasible", "arch": "3x12x384x1536", "reward": 0.8, "loss": 0.2, **extra}
        study.add_trial(optuna.trial.create_trial(value=0.8, user_attrs=attrs))
    assert [r.number for r in finalists(study, "reward")] == [0]


def test_a_final_run_takes_the_rows_whose_targets_are_on_disk_up_to_one_pass(teacher, news_texts, tmp_path):
    """An earlier, longer run of the same corpus left the teacher's targets of more rows: the final run
    starts with as many as one pass of its steps reads, and grows into the rest without a teacher pass."""
    from types import SimpleNamespace

    from kdnas.distill import Needs, TeacherCache
    from kdnas.nas.final._train import _grower, with_stored_rows
    from kdnas.nas.recipe import final_transfer_set

    cfg = SearchConfig.from_flags(teacher="minilm-l6", final_steps=4, final_train=16, final_batch_size=8, seq_len=32,
                       proxy_eval=8, final_unit="sentence", timeout=600, final_max_steps=40)
    ctx = SimpleNamespace(config=cfg, teacher=teacher, texts=news_texts,
                          progress=SimpleNamespace(phase=lambda text: None))
    last = Needs(hidden=frozenset({teacher.dims.layers}))
    TeacherCache(teacher, final_transfer_set(cfg, teacher, news_texts, 48), directory=tmp_path).ensure("train", last)
    cache = TeacherCache(teacher, final_transfer_set(cfg, teacher, news_texts), directory=tmp_path)
    assert cache.data.num_train == 16
    started = with_stored_rows(ctx, cache)
    assert started.data.num_train == 32  # 4 steps x 8 rows: one pass, of the 48 on disk
    grown = _grower(ctx, started, "final")(5)
    assert grown.data.num_train == 40  # one pass of 5 steps (the rule alone asks for 16 rows: no growth)
    grown.ensure("train", last)
    assert grown.teacher_passes == 0  # read from the 48 rows' files
    assert _grower(ctx, grown, "final")(5) is None
    bare = TeacherCache(teacher, final_transfer_set(cfg, teacher, news_texts))  # no folder: nothing on disk
    assert with_stored_rows(ctx, bare) is bare


def test_what_a_finalists_run_leaves_for_after_it_adds_each_step_its_timing_says_follows():
    """The export and readings always; the teacher's plan scored beside it where one fits; the next candidate's
    work where its reading was marginal (each part read off a field of `RunTiming`)."""
    from kdnas.nas.final._shipping import TEACHER_STEPS, RunTiming, _after_run_s
    from kdnas.nas.schema import PlanRecord

    plain = RunTiming(step_s=4.0, finalists_left=1, before_ms=3.0)
    assert _after_run_s(plain, layers=3, baselines_s=12.0) == after_training_s(4.0, 12.0)
    teacher = RunTiming(step_s=4.0, finalists_left=1, before_ms=3.0, teacher_plan=PlanRecord(kept=2))
    assert _after_run_s(teacher, 3, 12.0) == after_training_s(4.0, 12.0) + TEACHER_STEPS * 4.0
    marginal = RunTiming(step_s=4.0, finalists_left=1, before_ms=3.0, marginal=True, proxy_s=20.0, train_step_s=0.5)
    after = after_training_s(4.0, 12.0)
    assert _after_run_s(marginal, 3, 12.0) == after + fallback_s(after, 4.0, 12.0, 20.0, MIN_CONTINUED_STEPS * 0.5)


def test_a_finalist_read_again_near_an_absolute_budget_and_refused_keeps_both_readings_in_its_record(monkeypatch):
    """A reading within MARGIN of a --budget-ms is read again (`settled`); where the mean is over, the finalist is
    refused before training with both readings: its record takes every fact the judge returns (a fresh-clone CI
    run failed on this path with "Refusal got an unexpected keyword argument 'settled_from_ms'")."""
    from pathlib import Path
    from types import SimpleNamespace

    from kdnas.nas.budgets import Budget
    from kdnas.nas.final import _latency
    from kdnas.nas.final._records import over_record
    from kdnas.nas.schema import BEFORE_TRAINING, Candidate, Refusal

    readings = iter([9.9, 10.5])
    monkeypatch.setattr(_latency, "final_latency", lambda ctx, graph, label: (
        SimpleNamespace(median_ms=next(readings)), [], {}))
    ctx = SimpleNamespace(config=SearchConfig.from_flags(budget_ms=10.0), budget_ms=10.0, budget=Budget(10.0),
                          budget_label=None, progress=SimpleNamespace(phase=lambda text: None))
    gate = _latency._judged(ctx, Path("x") / "model.onnx", "final 1/1", 1)
    assert gate.ms == pytest.approx(10.2) and gate.facts == {"settled_from_ms": [9.9, 10.5]}
    row = Candidate(number=3, arch="3x12x384x1536", layers=3, heads=12, hidden=384, ffn=1536, reward=0.9)
    refusal = over_record(row, ctx, None, gate.ms, gate.readings, **gate.facts, graph=gate.graph)
    assert (refusal.stage, refusal.settled_from_ms, refusal.graph) == (BEFORE_TRAINING, [9.9, 10.5], "model.onnx")
    assert Refusal.from_attrs(refusal.to_attrs()) == refusal  # as the study stores it
