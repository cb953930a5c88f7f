"""How many final-run steps would the demo's shape need for embedding fidelity ρ 0.95 on this recipe?

Reads the measured runs of one recipe — each a whole schedule of its own length (warm-up and linear
decay over exactly its steps), scored at its end — from the recipe sweeps' JSON files, and fits
ρ(n) = a − b·n^(−c) (a power law in the steps with an asymptote `a`) by least squares. Before
trusting the forecast it checks the method: the fit without the longest run must predict that run.
The fit uses the fp32 runs; a run of the same recipe in another precision (bf16, on a CPU that has
it) tests the forecast beyond the runs it was made from (`tested`), and a second fit over every run
(`fit_all`) gives the forecast those runs support.

    python benchmarks/long_budget_forecast.py            # -> benchmarks/results/long_budget_forecast.json

No training here: the runs come from `recipe_sweep.py` (the commands are in
docs/design/final-recipe.md, "A long budget needs more text").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


RESULTS = Path(__file__).parent / "results"
SOURCES = ("final_terms.json", "long_budget_mse.json")
# The demo's shape and today's final recipe (`kdnas search` defaults), seed 0; fitted in fp32.
RUN = {"recipe": "embed=mse+cos+rel:even:1e-3", "arch": "3x12x384x1280", "batch_size": 32, "seed": 0,
       "unit": "sentence"}
FIT_PRECISION = "fp32"


def fit(steps: np.ndarray, rho: np.ndarray) -> dict[str, float]:
    """Least-squares a, b, c of ρ = a − b·n^(−c): for each c on a fine grid a and b are linear."""
    best = None
    for c in np.linspace(0.02, 2.0, 1981):
        x = np.stack([np.ones_like(steps), -(steps ** -c)], axis=1)
        (a, b), *_ = np.linalg.lstsq(x, rho, rcond=None)
        sse = float(np.sum((x @ np.array([a, b]) - rho) ** 2))
        if best is None or sse < best["sse"]:
            best = {"a": float(a), "b": float(b), "c": float(c), "sse": sse}
    best["rmse"] = float(np.sqrt(best["sse"] / len(steps)))
    return best


def predict(params: dict[str, float], steps: float) -> float:
    return params["a"] - params["b"] * steps ** -params["c"]


def steps_for(params: dict[str, float], target: float) -> float | None:
    """Steps at which the fitted curve reaches `target` (None: its asymptote is below it)."""
    if params["a"] <= target:
        return None
    return float((params["b"] / (params["a"] - target)) ** (1 / params["c"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--out", type=Path, default=RESULTS / "long_budget_forecast.json")
    args = parser.parse_args()
    from _env import environment

    every = [dict(r, source=name) for name in SOURCES for r in json.loads((RESULTS / name).read_text())["runs"]
             if all(r.get(k) == v for k, v in RUN.items())]
    every.sort(key=lambda r: r["steps"])
    runs = [r for r in every if r["precision"] == FIT_PRECISION]
    steps = np.array([float(r["steps"]) for r in runs])
    rho = np.array([float(r["spearman"]) for r in runs])
    if len(runs) < 4:
        raise SystemExit(f"{len(runs)} {FIT_PRECISION} runs of {RUN} found in {SOURCES}: a check of the fit needs at least 4")
    whole = fit(steps, rho)
    held = fit(steps[:-1], rho[:-1])
    longest = runs[-1]
    seconds_per_step = longest["loop_seconds"] / longest["steps"]
    needed, needed_held = steps_for(whole, args.target), steps_for(held, args.target)
    result = {
        "run": {**RUN, "precision": FIT_PRECISION}, "model": "rho(n) = a - b * n^-c, least squares",
        "runs": [_row(r, whole) for r in runs],
        "fit": {k: round(v, 6) for k, v in whole.items()},
        "check": {"fitted_without": longest["steps"], "predicted": round(predict(held, longest["steps"]), 4),
                  "measured": longest["spearman"], "fit": {k: round(v, 6) for k, v in held.items()}},
        "target": args.target,
        "steps_needed": None if needed is None else round(needed, -2),
        "steps_needed_without_longest": None if needed_held is None else round(needed_held, -2),
        # at the longest run's own pace (its steps and evaluations, fp32 on the CPU that ran it)
        "seconds_per_step": round(seconds_per_step, 4),
        "hours_needed": None if needed is None else round(needed * seconds_per_step / 3600, 1),
        # the same recipe in another precision: the forecast against what was measured
        "tested": [_row(r, whole) for r in every if r["precision"] != FIT_PRECISION],
    }
    if result["tested"]:
        both = fit(np.array([float(r["steps"]) for r in every]), np.array([float(r["spearman"]) for r in every]))
        last = every[-1]
        pace_all = last["loop_seconds"] / last["steps"]
        needed_all = steps_for(both, args.target)
        result["fit_all"] = {**{k: round(v, 6) for k, v in both.items()},
                             "steps_needed": None if needed_all is None else round(needed_all, -2),
                             # at the pace of the longest run of all (its precision, on its CPU)
                             "seconds_per_step": round(pace_all, 4),
                             "hours_needed": None if needed_all is None else
                             round(needed_all * pace_all / 3600, 1)}
    result["environment"] = environment()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = ("runs", "fit", "check", "steps_needed", "hours_needed", "tested", "fit_all")
    print(json.dumps({k: result[k] for k in shown if k in result}, indent=1))
    return 0


def _row(run: dict, params: dict[str, float]) -> dict:
    return {"steps": run["steps"], "train": run["train"], "precision": run["precision"], "spearman": run["spearman"],
            "source": run["source"], "fitted": round(predict(params, run["steps"]), 4)}


if __name__ == "__main__":
    sys.exit(main())
