"""KD-NAS reward on the worked values, and the search space (real Optuna trials, no mocks)."""

from __future__ import annotations

import math

import optuna
import pytest

from kdnas.core.errors import KdnasError
from kdnas.nas import SearchSpace, default_space, kdnas_reward, reference_shapes
from kdnas.nas.space import load_space_file, override_space, parse_choices


def test_reward_worked_values_from_methods_md():
    assert kdnas_reward(0.2, 0.6, 1.0) == pytest.approx(0.8, abs=1e-12)
    assert kdnas_reward(0.2, 1 / 7, 1.0) == pytest.approx(0.8719, abs=1e-4)
    assert kdnas_reward(0.2, 1 / 7, 1.0) == pytest.approx(0.8 * (1 / 4.2) ** -0.06, rel=1e-12)
    # Units cancel: ms in, same reward.
    assert kdnas_reward(0.2, 6.0, 10.0) == pytest.approx(0.8)


def test_reward_is_soft_in_latency_and_linear_in_loss():
    fast, slow = kdnas_reward(0.3, 1.0, 10.0), kdnas_reward(0.3, 8.0, 10.0)
    assert fast > slow and fast / slow < 1.2  # weak pressure, as in the paper
    assert kdnas_reward(0.1, 6.0, 10.0) - kdnas_reward(0.2, 6.0, 10.0) == pytest.approx(0.1)
    assert kdnas_reward(0.2, 6.0, 10.0, target_ratio=0.3, exponent=0.0) == pytest.approx(0.8)


@pytest.mark.parametrize("args", [(0.2, 0.0, 1.0), (0.2, 1.0, -1.0), (math.nan, 1.0, 1.0), (0.2, math.inf, 1.0)])
def test_reward_rejects_meaningless_input(args):
    with pytest.raises(KdnasError):
        kdnas_reward(*args)


@pytest.mark.parametrize("teacher", [(6, 12, 384, 1536), (12, 12, 768, 3072), (4, 8, 256, 1024), (24, 16, 1024, 4096)])
def test_default_space_only_holds_valid_shapes(teacher):
    space = default_space(*teacher)
    assert space.rectangular, "every (heads, hidden) pair of a default space must be valid"
    assert max(space.layers) == teacher[0] and max(space.hidden) <= teacher[2] and max(space.ffn) == teacher[3]
    assert teacher[1] in space.heads
    assert space.size == len(space.layers) * len(space.heads) * len(space.hidden) * len(space.ffn)


def test_default_space_for_minilm():
    space = default_space(6, 12, 384, 1536)
    assert space.to_dict() == {"layers": [1, 2, 3, 4, 5, 6], "heads": [4, 6, 12], "hidden": [96, 192, 288, 384],
                               "ffn": [256, 512, 768, 1024, 1280, 1536]}
    assert space.fastest() == (1, 4, 96, 256)


def test_inherited_default_space_keeps_the_teacher_head_size():
    space = default_space(6, 12, 384, 1536, keep_head_size=True)
    assert space.to_dict() == {"layers": [1, 2, 3, 4, 5, 6], "heads": [3, 6, 9, 12], "hidden": [96, 192, 288, 384],
                               "ffn": [256, 512, 768, 1024, 1280, 1536], "head_size": 32}
    assert space.widths() == [(3, 96), (6, 192), (9, 288), (12, 384)] and space.rectangular
    assert space.size == 6 * 4 * 6 and space.fastest() == (1, 3, 96, 256)
    base = default_space(12, 12, 768, 3072, keep_head_size=True)  # BERT-base: heads of 64
    assert base.hidden == (128, 256, 384, 512, 640, 768) and base.heads == (2, 4, 6, 8, 10, 12)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(40):
        trial = study.ask()
        layers, heads, hidden, ffn = space.suggest(trial)
        assert hidden // heads == 32 and space.reject_reason(layers, heads, hidden, ffn) is None
        assert "heads" not in trial.params  # derived, not searched
        study.tell(trial, 0.0)
    assert "head size 32" in space.reject_reason(3, 6, 384, 1024)
    # Overriding hidden keeps the head size; overriding heads frees it; an uneven width is one clear error.
    assert override_space(space, {"hidden": "192,384"}).heads == (6, 12)
    free = override_space(space, {"heads": "4,6,12"})
    assert free.head_size is None and (6, 384) in free.widths()
    with pytest.raises(KdnasError, match="not a multiple of the head size 32"):
        override_space(space, {"hidden": "100"})


def test_sampler_never_proposes_outside_the_space():
    space = default_space(6, 12, 384, 1536)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(60):
        trial = study.ask()
        layers, heads, hidden, ffn = space.suggest(trial)
        assert layers in space.layers and heads in space.heads and hidden in space.hidden and ffn in space.ffn
        assert space.reject_reason(layers, heads, hidden, ffn) is None
        study.tell(trial, 0.0)


def test_parse_choices_forms():
    assert parse_choices("1-6", "layers") == (1, 2, 3, 4, 5, 6)
    assert parse_choices("96-384:96", "hidden") == (96, 192, 288, 384)
    assert parse_choices("4,6, 12", "heads") == (4, 6, 12)
    assert parse_choices([2, "4-5"], "layers") == (2, 4, 5)
    for bad in ("6-1", "a,b", "", "1-4:0", True):
        with pytest.raises(KdnasError):
            parse_choices(bad, "layers")


def test_user_space_with_invalid_pairs_rejects_them_and_no_valid_shape_is_an_error():
    space = override_space(default_space(6, 12, 384, 1536), {"heads": "4,12", "hidden": "128,384"})
    assert not space.rectangular
    assert space.widths() == [(4, 128), (4, 384), (12, 384)]
    assert "not divisible" in space.reject_reason(2, 12, 128, 512)
    with pytest.raises(KdnasError, match="no valid shape"):
        SearchSpace(layers=(2,), heads=(5,), hidden=(96, 128), ffn=(256,))
    with pytest.raises(KdnasError, match="unknown key"):
        override_space(space, {"depth": 3})


def test_space_files_toml_and_yaml(tmp_path):
    (tmp_path / "s.toml").write_text('[space]\nlayers = "2-4"\nheads = [4, 12]\n')
    (tmp_path / "s.yaml").write_text("hidden: 96-192:96\nffn: [256, 512]\n")
    (tmp_path / "bad.toml").write_text("layers = [\n")
    assert load_space_file(tmp_path / "s.toml") == {"layers": "2-4", "heads": [4, 12]}
    assert load_space_file(tmp_path / "s.yaml") == {"hidden": "96-192:96", "ffn": [256, 512]}
    with pytest.raises(KdnasError, match="cannot be parsed"):
        load_space_file(tmp_path / "bad.toml")


def test_reference_shapes_are_table1_for_a_base_teacher_and_scale_to_minilm():
    assert dict(reference_shapes(12, 768, 3072)) == {
        "6L-DistilBERT": (6, 12, 768, 3072), "6L": (6, 12, 384, 1536), "4L": (4, 12, 576, 768), "3L": (3, 12, 384, 1024)}
    assert dict(reference_shapes(12, 384, 1536)) == {
        "6L-DistilBERT": (6, 12, 384, 1536), "6L": (6, 12, 192, 768), "4L": (4, 12, 288, 384), "3L": (3, 12, 192, 512)}


def test_final_train_must_be_positive():
    from kdnas.nas.config import SearchConfig

    with pytest.raises(KdnasError, match="final_train=0"):
        SearchConfig.from_flags(final_train=0)
    assert SearchConfig().proxy.steps == 30 and SearchConfig.from_flags(proxy="hs").proxy.steps == 60
    assert SearchConfig().with_flags(proxy="hs").proxy.steps == 60 and SearchConfig().final.train == 7680


def test_a_long_final_run_gets_enough_sentences_to_see_none_more_than_five_times():
    from kdnas.nas.config import SearchConfig

    assert SearchConfig().final.rows == SearchConfig().final.train == 7680  # the demo: 1,200 x 32 = 5 passes
    assert SearchConfig.from_flags(final_steps=3000).final.rows == 19200  # 3,000 x 32 / 5
    assert SearchConfig.from_flags(final_steps=3000, final_batch_size=16, final_train=20000).final.rows == 20000
    assert SearchConfig.from_flags(final_steps=0).final.rows == 7680
    assert SearchConfig.from_flags(final_steps=600, final_train=4096).final.rows == 4096  # 4.7 passes


def test_the_final_run_perturbs_batches_only_where_the_corpus_runs_short():
    from kdnas.nas.config import AUGMENT_SHARE, SearchConfig

    assert SearchConfig().final.augment_for(7680) == 0.0  # the demo: five passes, text enough
    long = SearchConfig.from_flags(final_steps=40000)  # asks for 256,000 sentences; the news corpus holds 79,148
    assert long.final.augment_for(long.final.rows) == 0.0 and long.final.augment_for(79148) == AUGMENT_SHARE == 0.5
    assert SearchConfig.from_flags(final_steps=40000, final_augment=0).final.augment_for(79148) == 0.0  # turned off
    assert SearchConfig.from_flags(final_augment=0.25).final.augment_for(7680) == 0.25  # asked for
    for bad in (1.5, -0.1, float("nan"), True):
        with pytest.raises(KdnasError, match="final augment .* must be the share of batches perturbed, 0 to 1"):
            SearchConfig.from_flags(final_augment=bad)


def test_the_final_runs_embed_terms_are_the_users_and_the_trials_keep_theirs(tmp_path):
    from kdnas.nas import SearchConfig
    from kdnas.nas.context import SearchContext

    cfg = SearchConfig.from_flags(final_embed_terms="mse+cos+rel+mid", proxy="fidelity", out=str(tmp_path))
    ctx = SearchContext(config=cfg, space=None, sizes=None, teacher=None, texts=[], data=None, cache=None,
                        teacher_latency_ms=1.0, budget_ms=1.0, progress=None)
    assert ctx.final_config().embed_terms == "mse+cos+rel+mid"
    assert SearchContext(**{**vars(ctx), "config": SearchConfig()}).final_config().embed_terms is None  # the method's
    assert ctx.distill_config(10).embed_terms is None  # the fidelity proxy's runs: the terms they were measured with
    with pytest.raises(KdnasError, match="final embed_terms='mse\\+bogus' is invalid: '\\+'-joined distinct terms of mse, tok"):
        SearchConfig.from_flags(final_embed_terms="mse+bogus")
    with pytest.raises(KdnasError, match="final embed terms 'mse' apply to the final method 'embed' only; .* 'hs'"):
        SearchConfig.from_flags(final_embed_terms="mse", final_method="hs")


def test_a_scored_candidate_is_one_record_for_every_stage():
    from kdnas.core.spec import StudentSpec
    from kdnas.nas import SearchConfig
    from kdnas.nas.context import SearchContext
    from kdnas.nas.proxy import ProxyMetrics
    from kdnas.nas.schema import Fidelity, LatencyRecord

    def context(**changes):
        return SearchContext(config=SearchConfig.from_flags(**changes), space=None, sizes={}, teacher=None, texts=None, data=None,
                             cache=None, teacher_latency_ms=10.0, budget_ms=5.0, progress=None)

    spec = StudentSpec(layers=3, heads=12, hidden=384, ffn=1024)
    latency = LatencyRecord(median_ms=4.0, p90_ms=4.2, noisy=False)
    l_hs = ProxyMetrics.of_distill({"l_hs_norm": 0.4, "l_hs_raw": 0.1, "l_hs_se": 0.003, "step": 60})
    # The paper's proxy: the reward's loss is L_HS.
    scored = context(proxy="hs").score(spec, l_hs, latency)
    assert scored.reward == kdnas_reward(0.4, 4.0, 10.0, 0.6, -0.06) and scored.within_budget
    assert scored.record() == {"arch": "3x12x384x1024", "params": spec.num_parameters(),
                               "latency": {"median_ms": 4.0, "p90_ms": 4.2, "noisy": False},
                               "loss": 0.4, "loss_se": 0.003, "fidelity": None,
                               "l_hs_norm": 0.4, "l_hs_raw": 0.1, "l_hs_se": 0.003, "reward": scored.reward,
                               "within_budget": True, "latency_ms": 4.0}
    # The fidelity proxy (default): the loss is 1 - rho; L_HS is kept beside it.
    scored = context().score(spec, l_hs.with_fidelity(Fidelity(spearman=0.75, spearman_se=0.01)), latency)
    assert (scored.loss, scored.loss_se, scored.fidelity, scored.l_hs_norm) == (0.25, 0.01, 0.75, 0.4)
    assert scored.reward == kdnas_reward(0.25, 4.0, 10.0, 0.6, -0.06)
    with pytest.raises(ValueError, match="needs the probe's rho"):  # the fidelity proxy, its student not scored
        context().score(spec, l_hs, latency)
    assert not context(proxy="hs").score(spec, ProxyMetrics(l_hs_norm=0.4, l_hs_raw=0.1, l_hs_se=0.0),
                                         LatencyRecord(median_ms=6.0)).within_budget


def test_pareto_finalists_are_front_members_best_reward_first():
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from kdnas.nas.final import finalists

    study = optuna.create_study(directions=["minimize", "minimize"])
    # (loss, latency ms, reward, status): 1 and 2 form the front; 0 is dominated by 1; 3 was over budget.
    for number, (loss, ms, reward, status) in enumerate([(0.5, 5.0, 0.50, "feasible"), (0.3, 4.0, 0.70, "feasible"),
                                                         (0.6, 1.0, 0.45, "feasible"), (1.0, 9.0, 0.0, "infeasible")]):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, values=[loss, ms], params={"layers": number + 1},
            distributions={"layers": IntDistribution(1, 6)},
            user_attrs={"arch": f"{number + 1}x4x96x256", "status": status, "loss": loss, "reward": reward,
                        "latency": {"median_ms": ms}}))
    assert [r.number for r in finalists(study, "pareto")] == [1, 2]  # front only, best reward first
    assert [r.number for r in finalists(study, "reward")] == [1, 0, 2]  # every trained trial


def test_the_rule_keeps_the_teachers_full_width_at_the_depth_that_fits():
    from kdnas.nas.space import default_space, rule_params

    minilm = default_space(6, 12, 384, 1536, keep_head_size=True)
    assert rule_params(minilm, 6, 0.5) == {"layers": 3, "hidden": 384, "ffn": 1536}
    assert rule_params(minilm, 6, 0.1) == {"layers": 1, "hidden": 384, "ffn": 1536}  # at least one layer
    mpnet = default_space(12, 12, 768, 3072, keep_head_size=True)
    assert rule_params(mpnet, 12, 0.148) == {"layers": 1, "hidden": 768, "ffn": 3072}
    assert rule_params(mpnet, 12, 0.25) == {"layers": 3, "hidden": 768, "ffn": 3072}
    free = default_space(6, 12, 384, 1536)  # heads searched: the most that divide the width
    assert rule_params(free, 6, 0.5) == {"layers": 3, "heads": 12, "hidden": 384, "ffn": 1536}
    from kdnas.nas.space import override_space

    deep_only = override_space(minilm, {"layers": "4-6"})
    assert rule_params(deep_only, 6, 0.5) is None  # the space holds no shape of the rule's depth


def test_a_shape_proposed_again_is_answered_from_the_study_and_not_counted():
    """Objective._repeat: the earlier trial's value is copied for the sampler, the trial is marked a repeat and
    counts for nothing — until every shape of the space was tried, when a repeat counts (so a study ends)."""
    from types import SimpleNamespace

    import optuna

    from kdnas.nas.resume import counted_trials
    from kdnas.nas.trial import Objective

    study = optuna.create_study()
    first = study.ask()
    first.set_user_attr("arch", "1x4x384x256")
    first.set_user_attr("status", "feasible")
    study.tell(first, 0.7)
    objective = Objective.__new__(Objective)
    objective.ctx = SimpleNamespace(config=SimpleNamespace(trial_count=6), space=SimpleNamespace(size=8))
    again = study.ask()
    again.set_user_attr("arch", "1x4x384x256")
    value = objective._repeat(again, study.trials[0])
    study.tell(again, value)
    assert value == 0.7 and study.trials[1].user_attrs["status"] == "repeat"
    assert "proposed again (not counted)" in study.trials[1].user_attrs["reason"]
    assert counted_trials(study) == 1
    objective.ctx.space.size = 1  # every shape of the space tried: a repeat counts
    third = study.ask()
    third.set_user_attr("arch", "1x4x384x256")
    study.tell(third, objective._repeat(third, study.trials[0]))
    assert study.trials[2].user_attrs["status"] == "feasible" and counted_trials(study) == 2
