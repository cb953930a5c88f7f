"""benchmarks/latency_model.py: trials per hour with the latency model on and off."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import latency_model  # noqa: E402


def test_the_trials_span_runs_from_the_first_start_to_the_last_end():
    rows = [{"datetime_start": "2026-12-01T10:00:00", "seconds_total": 10.0},
            {"datetime_start": "2026-12-01T10:00:12", "seconds_total": 8.0},
            {"datetime_start": None, "seconds_total": None}]  # a trial still running counts nowhere
    assert latency_model.trial_span_s(rows) == 20.0


def test_searches_alternate_on_and_off_per_seed_and_are_paired_by_seed(tmp_path, monkeypatch):
    order = []

    def one_search(teacher, seed, trials, model_on, work):
        order.append((seed, model_on))
        return {"seed": seed, "trials_per_hour": 300.0 if model_on else 200.0,
                "best_arch": "3x12x384x1536" if model_on or seed == 0 else "2x12x384x1536"}

    monkeypatch.setattr(latency_model, "one_search", one_search)
    result = latency_model.trials_per_hour("minilm-l6", 2, 30, tmp_path)
    assert order == [(0, True), (0, False), (1, True), (1, False)]
    assert [p["ratio"] for p in result["pairs"]] == [1.5, 1.5] and result["ratio_min"] == 1.5
    assert [p["same_best_shape"] for p in result["pairs"]] == [True, False] and not result["same_best_shape"]
