"""The Pareto page's figure: every trained trial carries its latency spread and its L_HS error bar."""

from __future__ import annotations

from nas.plots import pareto_figure


def _row(number: int, latency: float, loss: float, se: float | None) -> dict:
    return {"number": number, "status": "feasible", "arch": "2x4x64x128", "params": 1_000_000,
            "latency_median_ms": latency, "latency_p90_ms": latency * 1.1, "latency_min_ms": latency * 0.9,
            "latency_cv": 0.05, "latency_noisy": False, "l_hs_norm": loss, "l_hs_raw": loss, "l_hs_se": se,
            "reward": 1 - loss, "reason": ""}


def test_trials_are_drawn_with_two_standard_errors_and_the_hover_says_so():
    facts = {"teacher_latency": {"median_ms": 10.0}, "settings": {"teacher": "t"}, "budget_ms": 5.0,
             "reference": [{"name": "3L", "arch": "3x12x192x512", "latency_ms": 2.0, "l_hs_norm": 0.6, "reward": 0.4}],
             "final": [{"latency_ms": 1.0, "l_hs_norm": 0.4, "arch": "2x4x64x128", "trial": 0, "steps": 5, "reward": 0.6}]}
    fig = pareto_figure([_row(0, 1.0, 0.5, 0.01), _row(1, 2.0, 0.45, None)], facts)
    trials = fig.data[0]
    assert list(trials.error_y.array) == [0.02, 0]  # a row without an estimate draws no bar
    assert "± 0.0100 (SE)" in trials.text[0]
    assert {t.name for t in fig.data} >= {"paper shapes, Table 1 scaled (proxy-distilled)", "finalist after --final-steps"}
