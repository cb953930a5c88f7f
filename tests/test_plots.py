"""The Pareto page's figure: every trained trial carries its latency spread and its loss's error bar."""

from __future__ import annotations

from kdnas.nas.plots import pareto_figure
from kdnas.nas.records import TrialRow
from kdnas.nas.schema import StudyFacts


def _row(number: int, latency: float, loss: float, se: float | None) -> TrialRow:
    return TrialRow(number=number, arch="2x4x64x128", params=1_000_000, latency_median_ms=latency,
                    latency_p90_ms=latency * 1.1, latency_min_ms=latency * 0.9, latency_cv=0.05, latency_noisy=False,
                    loss=loss, loss_se=se, fidelity=1 - loss, l_hs_norm=0.7, l_hs_raw=0.7, l_hs_se=0.003,
                    reward=1 - loss)


def test_trials_are_drawn_with_two_standard_errors_and_the_hover_says_so():
    facts = StudyFacts.from_attrs({  # as the study stores them
        "teacher_latency": {"median_ms": 10.0}, "settings": {"teacher": "t", "proxy": "fidelity"}, "budget_ms": 5.0,
        "reference": [{"name": "3L", "arch": "3x12x192x512", "latency_ms": 2.0, "loss": 0.3, "l_hs_norm": 0.6,
                       "reward": 0.4}],
        # a finalist recorded before the loss was stored: drawn at its L_HS
        "final": [{"latency_ms": 1.0, "l_hs_norm": 0.4, "arch": "2x4x64x128", "trial": 0, "steps": 5, "reward": 0.6,
                   "dir": "runs/x/best"}]})
    fig = pareto_figure([_row(0, 1.0, 0.5, 0.01), _row(1, 2.0, 0.45, None)], facts)
    trials = fig.data[0]
    assert list(trials.y) == [0.5, 0.45] and list(trials.error_y.array) == [0.02, 0]  # no estimate, no bar
    assert "loss 0.5000 ± 0.0100 (SE); fidelity ρ 0.5000" in trials.text[0] and "L_HS norm 0.7000" in trials.text[0]
    assert fig.layout.yaxis.title.text.startswith("1 − embedding fidelity ρ")
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["paper shapes, Table 1 scaled (proxy-distilled)"].y) == [0.3]
    assert list(by_name["finalist after --final-steps"].y) == [0.4]
    assert {t.name for t in fig.data} >= {"paper shapes, Table 1 scaled (proxy-distilled)", "finalist after --final-steps"}


def test_a_study_s_settings_are_read_as_stored_now_and_as_earlier_versions_stored_them():
    from kdnas.nas.config import StoredSettings
    from kdnas.nas.plots import latency_setting
    from kdnas.nas.schema import StudyFacts

    nested = {"teacher": "minilm-l6", "proxy": {"kind": "fidelity", "steps": 30},
              "latency": {"batch": 1, "seq": 128, "threads": 2, "runtime": "onnxruntime"},
              "reward": {"objective": "pareto", "target_ratio": 0.5, "exponent": -0.06}}
    flat = {"teacher": "minilm-l6", "proxy": "fidelity", "proxy_steps": 30, "latency_batch": 1, "latency_seq": 128,
            "threads": 2, "runtime": "onnxruntime", "objective": "pareto", "target_ratio": 0.5}
    assert latency_setting(nested) == latency_setting(flat) == "batch 1, seq 128, 2 threads, onnxruntime"
    now, before = StoredSettings.of(nested), StoredSettings.of(flat)
    assert now == before and now.teacher == "minilm-l6" and now.proxy.kind == "fidelity" and now.proxy.steps == 30
    assert (now.reward.objective, now.reward.target_ratio, now.reward.exponent) == ("pareto", 0.5, -0.06)
    unknown = StoredSettings.of({})  # before `proxy` existed: the paper's proxy; defaults where nothing was stored
    assert unknown.proxy.kind == "hs" and unknown.reward.target_ratio == 0.6 and unknown.teacher is None
    # read once, where a study's facts are read: the flat fields of an earlier version are nested there
    old = StudyFacts(settings=flat).settings
    assert old["proxy"]["kind"] == "fidelity" and old["latency"] == nested["latency"]
    assert StudyFacts(settings=nested).settings == nested  # this version's: as stored
