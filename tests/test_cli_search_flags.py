"""One source for the search's settings: the flags carry the dataclasses' defaults, every setting is
reachable from the command line (or listed here as not a flag), and the study settings are what defines a
trial: the top-level fields, the resolved proxy recipe, latency and reward — never the run or the final recipe."""

from __future__ import annotations

import dataclasses

import pytest

from kdnas.cli import build_parser
from kdnas.nas import SearchConfig
from kdnas.nas._cli import config_from_args
from kdnas.nas.config import FLAGS, FinalRecipe, RunSettings

NOT_FLAGS = {"space", "space_overrides", "prune", "progress", "stale_after_s", "latency_model"}  # mapped or Python-only


def test_every_setting_has_a_flag_with_the_dataclass_default():
    args = build_parser().parse_args(["search"])
    defaults = SearchConfig().flags()
    for name, value in defaults.items():
        if name in NOT_FLAGS:
            continue
        assert hasattr(args, name), f"SearchConfig's {FLAGS[name]} has no --{name.replace('_', '-')}"
        if name not in ("budget_ms", "proxy_steps"):  # None on the command line: derived by the config
            assert getattr(args, name) == value, name
    assert config_from_args(args, {}) == SearchConfig()


def test_each_flag_names_one_field_and_round_trips():
    assert len(set(FLAGS.values())) == len(FLAGS)  # no two flags for one field
    config = SearchConfig.from_flags(final_steps=600, threads=1, proxy="hs", objective="pareto", out="x")
    assert (config.final.steps, config.latency.threads, config.proxy.kind, config.reward.objective,
            config.run.out) == (600, 1, "hs", "pareto", "x")
    assert config.proxy.steps == 60  # derived for the hs proxy
    assert SearchConfig.from_flags(**config.flags()) == config
    import pytest
    with pytest.raises(TypeError, match="not a kdnas search setting: lr"):
        SearchConfig.from_flags(lr=1e-3)


def test_flags_reach_the_config():
    args = build_parser().parse_args(["search", "--trials", "9", "--no-prune", "--final-lr", "1e-4", "--layers", "2",
                                      "--no-latency-model", "--runtime", "onnxruntime-int8",
                                      "--final-augment", "0", "--final-save-every", "0",
                                      "--final-embed-terms", "mse+cos"])
    config = config_from_args(args, {"layers": "2"})
    assert (config.run.trials, config.proxy.prune, config.final.lr, dict(config.space_overrides)) == (9, False, 1e-4,
                                                                                                    {"layers": "2"})
    assert config.final.augment == 0.0 and config.final.save_every == 0 and config.final.embed_terms == "mse+cos"
    assert config.run.latency_model is False and config.latency.runtime == "onnxruntime-int8"


def test_the_hs_proxy_from_the_command_line_trains_its_own_default_steps():
    args = build_parser().parse_args(["search", "--proxy", "hs"])
    assert config_from_args(args, {}).proxy.steps == 60


def test_a_bad_save_interval_for_the_final_run_is_refused():
    import pytest

    from kdnas.core.errors import InputError

    for bad in (-1, 2.5, True):
        with pytest.raises(InputError, match=rf"final save every {bad!r} steps is invalid: a whole number >= 0"):
            SearchConfig.from_flags(final_save_every=bad)


def test_study_settings_are_what_defines_a_trial_and_never_the_run_or_the_final_recipe():
    config = SearchConfig()
    space = config.resolve_space(type("Dims", (), {"layers": 6, "heads": 12, "hidden": 384, "ffn": 1536})())
    settings = config.study_settings(space, "fingerprint")
    assert {"proxy", "latency", "reward", "budget_ratio", "teacher", "space", "device"} <= settings.keys()
    assert not settings.keys() & {"run", "final"}
    assert settings["latency"]["threads"] == 2 and settings["proxy"]["steps"] == 30 and settings["proxy"]["prune"] is False
    assert settings["dtype"] == "fp32" and settings["teacher_fingerprint"] == "fingerprint"
    # proxy scores trained in bf16 and in fp32 must not mix in one study
    assert config.study_settings(space, "fingerprint", "cpu", "bf16")["dtype"] == "bf16"
    assert settings["precision"] == "auto"
    # whatever the run or the final recipe says (but what the fidelity proxy borrows), the settings stay
    for group, cls in (("run", RunSettings), ("final", FinalRecipe)):
        for f in dataclasses.fields(cls):
            if group == "final" and f.name in ("method", "batch_size", "train", "unit"):
                continue
            other = {"out": "elsewhere", "trials": 3, "timeout": 600.0, "storage": "sqlite:///x.db", "study_name": "s",
                     "latency_model": False, "reference": True, "progress": False, "stale_after_s": 9.0,
                     "cache_dir": "none", "target": "t.json", "steps": 7, "max_steps": None, "top_k": 2, "lr": 5e-4, "augment": 0.25,
                     "embed_terms": "mse+cos", "save_every": 0, "quality_sentences": 10}[f.name]
            changed = dataclasses.replace(config, **{group: dataclasses.replace(getattr(config, group), **{f.name: other})})
            assert changed.study_settings(space, "fingerprint") == settings, f"{group}.{f.name}"


def test_the_settings_hold_the_recipe_the_proxy_trains_with():
    space = SearchConfig().resolve_space(type("Dims", (), {"layers": 6, "heads": 12, "hidden": 384, "ffn": 1536})())

    def recipe(**changes):
        return SearchConfig.from_flags(**changes).study_settings(space, "fingerprint")["proxy"]

    assert recipe() == {"kind": "fidelity", "sentences": 300, "steps": 30, "eval": 256, "seq_len": 64, "prune": False,
                        "method": "embed", "batch_size": 32, "train": 7680, "unit": "sentence", "lr": 3e-4}
    for name, value in (("final_method", "hs"), ("final_batch_size", 16), ("final_train", 4096), ("final_unit", "window")):
        assert recipe(**{name: value}) != recipe(), name  # a resume that changes it is refused
    # the hs proxy trains with its own fields; the final run's may change between runs
    assert recipe(proxy="hs") == recipe(proxy="hs", final_method="hs", final_batch_size=16)
    assert recipe(proxy="hs")["method"] == "hs" and recipe(proxy="hs", proxy_lr=1e-3)["lr"] == 1e-3
    assert recipe(final_steps=300, final_lr=1e-4) == recipe()


def test_each_method_gets_only_the_options_it_takes():
    import pytest

    from kdnas.core.errors import InputError
    from kdnas.nas.context import SearchContext

    def configs(**changes):
        ctx = SearchContext(config=SearchConfig.from_flags(**changes), space=None, sizes={}, teacher=None, texts=None, data=None,
                            cache=None, teacher_latency_ms=1.0, budget_ms=1.0, progress=None)
        return ctx.distill_config(60).method_options(), ctx.final_config().method_options()

    # The default layer map reaches the methods that take one, and not embed (which would refuse it).
    assert configs() == ({}, {})  # the fidelity proxy is the final recipe (embed), shortened
    assert configs(proxy="hs") == ({"layer_map": "uniform"}, {})
    assert configs(proxy="hs", proxy_method="embed") == ({}, {})
    assert configs(proxy="hs", proxy_method="embed", final_method="hs", layer_map="last") == ({}, {"layer_map": "last"})
    assert configs(proxy="hs", proxy_method="pkd", final_method="hs", layer_map="last") == ({"layer_map": "last"},
                                                                                      {"layer_map": "last"})
    with pytest.raises(InputError, match=r"layer map 'last' applies to the methods hs, pkd; proxy method 'embed' and final method 'embed' have none"):
        SearchConfig.from_flags(proxy="hs", proxy_method="embed", layer_map="last")
    with pytest.raises(InputError, match=r"proxy method 'od' is invalid: allowed hs, "):
        SearchConfig.from_flags(proxy="hs", proxy_method="od")
    with pytest.raises(InputError, match=r"precision 'fp16' is invalid: allowed auto, bf16, fp32"):
        SearchConfig.from_flags(precision="fp16")
    # the proxy and the final run train in the search's precision
    ctx = SearchContext(config=SearchConfig.from_flags(precision="fp32"), space=None, sizes={}, teacher=None, texts=None,
                        data=None, cache=None, teacher_latency_ms=1.0, budget_ms=1.0, progress=None)
    assert ctx.distill_config(30).precision == ctx.final_config().precision == "fp32"


def test_a_field_only_the_hs_proxy_reads_is_refused_with_the_fidelity_proxy():
    import pytest

    from kdnas.core.errors import InputError

    for name, value in (("proxy_lr", 1e-3), ("proxy_method", "minilm"), ("proxy_batch_size", 4), ("proxy_train", 32)):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(InputError, match=rf"^{flag} .* shapes the hs proxy only; .* add --proxy hs"):
            SearchConfig.from_flags(**{name: value})
        assert SearchConfig.from_flags(proxy="hs", **{name: value}).flags()[name] == value


def test_the_fidelity_proxy_keeps_the_learning_rate_its_ranking_was_measured_at():
    from kdnas.nas.config import PROXY_FINAL_LR
    from kdnas.nas.context import SearchContext

    def context(**changes):
        return SearchContext(config=SearchConfig.from_flags(**changes), space=None, sizes={}, teacher=None, texts=None,
                             data=None, cache=None, teacher_latency_ms=1.0, budget_ms=1.0, progress=None)

    ctx = context()
    assert (ctx.distill_config(30).lr, ctx.final_config().lr) == (PROXY_FINAL_LR, SearchConfig().final.lr)
    assert SearchConfig().final.lr > PROXY_FINAL_LR  # the final run's own, measured over 1,200 steps
    assert (context(final_lr=1e-4).distill_config(30).lr, context(final_lr=1e-4).final_config().lr) == (3e-4, 1e-4)
    # the same recipe otherwise: method, batch, steps' schedule
    proxy, final = ctx.distill_config(30), ctx.final_config()
    assert (proxy.method, proxy.batch_size, proxy.steps) == (final.method, final.batch_size, 30)


def test_workers_are_started_only_once_every_flag_is_checked(tmp_path, capsys):
    """A bad flag with --workers N was refused by each worker (N lines), after the cores were split."""
    import kdnas.cli

    code = kdnas.cli.main(["search", "--workers", "2", "--storage", f"journal:{tmp_path / 'j.log'}",
                           "--exponent", "nan", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "exponent nan must be a finite number" in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("timeout", ["5", "299"])
def test_a_timeout_too_short_for_any_search_is_one_line_naming_the_least_that_works(tmp_path, capsys, timeout):
    from kdnas.cli import main
    from kdnas.nas.config import MIN_TIMEOUT_S

    out = tmp_path / "run"
    assert main(["search", "--out", str(out), "--timeout", timeout]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--timeout {timeout} s is too short" in err
    assert f"give --timeout {MIN_TIMEOUT_S} or more, or none" in err
    assert not out.exists()


@pytest.mark.parametrize("shape, least", [
    ((6, 384, 1536), 300),  # the bundled teacher: what MIN_TIMEOUT_S was measured on
    ((2, 128, 512), 300),  # smaller: never under the least measured
    ((12, 768, 3072), 1800),  # MPNet-base: 8x the multiply-adds per token, its measured least
    ((2, 768, 3072), 420),  # 1.33x, in whole minutes
])
def test_the_least_timeout_scales_with_the_teachers_multiply_adds(shape, least):
    from kdnas.nas.config import least_timeout_s

    assert least_timeout_s(*shape) == least


def test_a_timeout_too_short_for_a_larger_teacher_is_one_line_naming_its_least(tmp_path, capsys):
    """The least --timeout is known once the teacher is read: 300 s suffices for the bundled teacher, not for a
    wider one (2 layers of 768, FFN 3072: 420 s). One line naming it, exit 2, no --out."""
    from transformers import AutoTokenizer

    from kdnas.cli import main
    from kdnas.core.assets import teacher_path
    from kdnas.core.spec import StudentSpec, build_student

    teacher = tmp_path / "wider-teacher"
    build_student(StudentSpec(layers=2, heads=12, hidden=768, ffn=3072), seed=0).save_pretrained(teacher)
    AutoTokenizer.from_pretrained(teacher_path("minilm-l6")).save_pretrained(teacher)
    out = tmp_path / "run"
    capsys.readouterr()  # the save's own progress bar (transformers writes one where stderr allows) is not kdnas's
    assert main(["search", "--teacher", str(teacher), "--out", str(out), "--timeout", "300", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--timeout 300 s is too short for a search of teacher" in err, err
    assert "give --timeout 420 or more, or none" in err and "(2x768, FFN 3072)" in err
    assert not out.exists()
