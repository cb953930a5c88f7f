"""benchmarks/long_budget_forecast.py: the power-law fit behind the long-budget forecast."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from long_budget_forecast import fit, predict, steps_for  # noqa: E402


def test_the_fit_recovers_a_known_curve_and_inverts_it():
    truth = {"a": 0.97, "b": 0.8, "c": 0.35}
    steps = np.array([800.0, 1200.0, 3000.0, 6000.0, 12000.0])
    rho = np.array([predict(truth, n) for n in steps])
    got = fit(steps, rho)
    assert got["a"] == pytest.approx(0.97, abs=2e-3) and got["c"] == pytest.approx(0.35, abs=2e-2)
    assert got["rmse"] < 1e-4
    n = steps_for(got, 0.95)
    assert predict(truth, n) == pytest.approx(0.95, abs=1e-3)
    assert steps_for(got, 0.99) is None  # above the asymptote: never
