"""How well the latency model predicts shapes it was not fitted on, per teacher family, on this host.

For each teacher, `--shapes` shapes drawn at random (seeded) from the search's default space for it (the
teacher's own family, its head size kept) are measured by `latency.profile` on the search's settings (fused
fp32 onnxruntime graph, batch 1, 128 tokens, 2 threads; the host's latency cache is used, as a search uses
it). The first `--train` readings fit the model (`latency.fit_latency_model`), the rest are held out: the
mean absolute percentage error and Kendall's τ of predicted against measured on them, and the share of held-out
shapes inside the model's own interval. The same is reported for fits on the first 6 and 12 readings (what a
search has after as many trials). The top-level `mape` / `kendall_tau` are the worst over the teachers.

The held-out readings are the last ones measured, so a change of the host's speed between the first and the
last readings (or readings taken from the latency cache, measured in an earlier session, beside fresh ones)
reads as model error. Beside the ordered split, `random_splits` refits on `--splits` random halves of the same
readings, and `held_out_bias` is the mean signed error of the ordered split's held-out shapes (0 for a model
that is off only by chance). `--readings-from FILE` refits the readings stored in an earlier result, measuring
nothing (its `measured_on` keeps where they were read); `--fresh` measures every shape now, the latency cache
neither read nor written, so fitted and held-out readings come from one session.

`--trials-per-hour SEEDS` adds what the model is for: on `--tph-teacher`, a default search of `--tph-trials`
trials (no final run) with the model on and off, alternating, seeds 0..SEEDS-1, each search with an empty
latency cache of its own (a user's first search; the teacher's targets are shared, computed once): trials
per hour over the trials' own span, the ratio on/off per seed, and whether both find the same best shape.

    python benchmarks/latency_model.py [--teachers minilm-l6,mpnet-base --shapes 36 --train 24] [--fresh]
    python benchmarks/latency_model.py --readings-from benchmarks/results/latency_model.json
    python benchmarks/latency_model.py --readings-from benchmarks/results/latency_model.json --trials-per-hour 3
Writes benchmarks/results/latency_model.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import tempfile
import time
from pathlib import Path

from _env import environment


def shapes_of(teacher_name: str, count: int, seed: int):
    from kdnas.core.spec import StudentSpec
    from kdnas.distill import load_teacher
    from kdnas.nas import default_space

    teacher = load_teacher(teacher_name)
    d = teacher.dims
    space = default_space(d.layers, d.heads, d.hidden, d.ffn, keep_head_size=True)
    sizes = teacher.student_sizes()
    rng = random.Random(seed)
    every = [(L, hid // space.head_size, hid, f) for L in space.layers for hid in space.hidden for f in space.ffn]
    return [StudentSpec(layers=L, heads=a, hidden=h, ffn=f, **sizes) for L, a, h, f in rng.sample(every, count)]


def evaluate(readings, train: int) -> dict:
    from kdnas.latency import fit_latency_model, kendall_tau, mape

    model = fit_latency_model(readings[:train])
    held = readings[train:]
    predicted = [model.predict(r.shape) for r in held]
    measured = [r.ms for r in held]
    return {"train": train, "held_out": len(held), "mape": round(mape([p.ms for p in predicted], measured), 4),
            "kendall_tau": round(kendall_tau([p.ms for p in predicted], measured), 4),
            "inside_interval": round(sum(p.low <= m <= p.high for p, m in zip(predicted, measured)) / len(held), 3),
            "loo_rel_error": round(model.rel_error, 4), "coef": [round(c, 5) for c in model.coef]}


def random_splits(readings, train: int, splits: int, seed: int) -> dict:
    """The held-out error over `splits` random choices of the `train` readings that fit the model."""
    from kdnas.latency import fit_latency_model, kendall_tau, mape

    rng, mapes, taus = random.Random(seed), [], []
    for _ in range(splits):
        order = rng.sample(range(len(readings)), len(readings))
        fit, held = [readings[i] for i in order[:train]], [readings[i] for i in order[train:]]
        model = fit_latency_model(fit)
        predicted, measured = [model.predict(r.shape).ms for r in held], [r.ms for r in held]
        mapes.append(mape(predicted, measured))
        taus.append(kendall_tau(predicted, measured))
    return {"splits": splits, "train": train, "mape_mean": round(sum(mapes) / splits, 4),
            "mape_range": [round(min(mapes), 4), round(max(mapes), 4)], "kendall_tau_mean": round(sum(taus) / splits, 4)}


def held_out_bias(readings, train: int) -> float:
    from kdnas.latency import fit_latency_model

    model = fit_latency_model(readings[:train])
    return round(sum((model.predict(r.shape).ms - r.ms) / r.ms for r in readings[train:]) / (len(readings) - train), 4)


def measure(name: str, shapes: int, seed: int, fresh: bool = False) -> list[dict]:
    from kdnas.latency import profile

    rows = []
    for spec in shapes_of(name, shapes, seed):
        res = profile(spec, batch=1, seq=128, threads=2, use_cache=not fresh)
        rows.append({"arch": spec.arch, "ms": round(res.median_ms, 3), "cached": bool(res.cached)})
        print(f"{name} {spec.arch:16s} {res.median_ms:8.2f} ms", flush=True)
    return rows


def trial_span_s(rows: list[dict]) -> float:
    """Seconds from the first trial's start to the last one's end (one worker: the trials run one after another)."""
    timed = [r for r in rows if r.get("datetime_start") and r.get("seconds_total") is not None]
    starts = [datetime.datetime.fromisoformat(r["datetime_start"]).timestamp() for r in timed]
    ends = [t + r["seconds_total"] for t, r in zip(starts, timed)]
    return max(ends) - min(starts)


def one_search(teacher: str, seed: int, trials: int, model_on: bool, work: Path) -> dict:
    """A default search without its final run, its latency cache empty (`$KDNAS_CACHE/latency` of its own);
    the assets and the teacher's targets are the real cache's."""
    from kdnas.core.assets import cache_root
    from kdnas.nas import SearchConfig, search

    real = cache_root()
    own = Path(tempfile.mkdtemp(prefix="kdnas-tph-", dir=work))
    for shared in ("assets", "targets"):
        (real / shared).mkdir(parents=True, exist_ok=True)
        (own / shared).symlink_to(real / shared)
    os.environ["KDNAS_CACHE"] = str(own)
    try:
        t0 = time.time()
        summary = search(SearchConfig.from_flags(teacher=teacher, trials=trials, seed=seed, latency_model=model_on, final_steps=0,
                                      out=str(own / "search"), progress=False)).to_json()
        wall = time.time() - t0
    finally:
        os.environ["KDNAS_CACHE"] = str(real)
    rows = [r for r in summary["trials_table"] if r["state"] == "COMPLETE"]
    span = trial_span_s(rows)
    return {"seed": seed, "latency_model": model_on, "trials": len(rows), "span_s": round(span, 1),
            "wall_s": round(wall, 1), "trials_per_hour": round(3600 * len(rows) / span, 1),
            "best_arch": (summary["best_trial"] or {}).get("arch"), "counts": summary["counts"],
            "predicted": summary["latency_model"]["predicted"],
            "seconds_per_trial": summary["seconds_per_trial"]}


def trials_per_hour(teacher: str, seeds: int, trials: int, work: Path) -> dict:
    """The model on and off, side by side: per seed the two searches run one after the other."""
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in range(seeds):
        for model_on in (True, False):
            runs.append(one_search(teacher, seed, trials, model_on, work))
            print(json.dumps(runs[-1]), flush=True)
    pairs = [{"seed": on["seed"], "ratio": round(on["trials_per_hour"] / off["trials_per_hour"], 3),
              "same_best_shape": on["best_arch"] == off["best_arch"], "best_on": on["best_arch"], "best_off": off["best_arch"]}
             for on, off in zip(runs[0::2], runs[1::2])]
    return {"teacher": teacher, "trials": trials, "seeds": seeds, "runs": runs, "pairs": pairs,
            "ratio_min": min(p["ratio"] for p in pairs), "same_best_shape": all(p["same_best_shape"] for p in pairs)}


def main() -> None:
    from kdnas.latency import Reading, Shape

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", default="minilm-l6,mpnet-base")
    parser.add_argument("--shapes", type=int, default=36)
    parser.add_argument("--train", type=int, default=24)
    parser.add_argument("--splits", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readings-from", type=Path, default=None, metavar="FILE",
                        help="refit the readings of an earlier result instead of measuring")
    parser.add_argument("--fresh", action="store_true", help="measure every shape now (the latency cache unused)")
    parser.add_argument("--trials-per-hour", type=int, default=0, metavar="SEEDS",
                        help="also searches with the model on and off on this many seeds (0: none)")
    parser.add_argument("--tph-teacher", default="minilm-l6")
    parser.add_argument("--tph-trials", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("runs/latency-model"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "latency_model.json")
    args = parser.parse_args()
    t0 = time.time()
    earlier = json.loads(args.readings_from.read_text()) if args.readings_from else None
    teachers = {}
    for name in (earlier["teachers"] if earlier else args.teachers.split(",")):
        rows = earlier["teachers"][name]["readings"] if earlier else measure(name, args.shapes, args.seed, args.fresh)
        readings = [Reading(Shape(*map(int, r["arch"].split("x"))), float(r["ms"])) for r in rows]
        fits = [evaluate(readings, n) for n in sorted({6, 12, args.train})]
        teachers[name] = {"family": name, "readings": rows, "fits": fits,
                          "cached": {"fitted_on": sum(r["cached"] for r in rows[:args.train]),
                                     "held_out": sum(r["cached"] for r in rows[args.train:])},
                          "held_out_bias": held_out_bias(readings, args.train),
                          "random_splits": random_splits(readings, args.train, args.splits, args.seed)}
        print(name, json.dumps(fits[-1]), json.dumps(teachers[name]["random_splits"]), flush=True)
    headline = [t["fits"][-1] for t in teachers.values()]
    result = {"what": __doc__.strip().splitlines()[0], "runtime": "onnxruntime (fused fp32 graph)", "batch": 1,
              "seq": 128, "threads": 2, "mape": max(h["mape"] for h in headline),
              "kendall_tau": min(h["kendall_tau"] for h in headline), "teachers": teachers,
              "seconds": round(time.time() - t0, 1), "environment": environment(),
              **({"measured_on": earlier.get("measured_on", earlier["environment"])} if earlier else {})}
    if args.trials_per_hour:
        result["trials_per_hour"] = trials_per_hour(args.tph_teacher, args.trials_per_hour, args.tph_trials, args.work)
    elif args.out.is_file() and "trials_per_hour" in (kept := json.loads(args.out.read_text())):
        result["trials_per_hour"] = kept["trials_per_hour"]  # a refit or a re-measure keeps the searches
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
