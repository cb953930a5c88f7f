"""How noisy is the search's score, and is it biased against narrow or wide students?

Runs the search's own proxy (`SearchContext.proxy` with `--proxy hs`, the paper's, whose score is
the cross-fitted held-out L_HS; otherwise the `SearchConfig` defaults apart from the seed:
inherited start, proxy steps, transfer rows) for a few shapes and
several search seeds (each seed draws its own transfer set, as a search with that seed would).
Reports per shape the mean and standard deviation of L_HS over seeds beside the mean standard error
that each single estimate reports (the trial record's error bar), whether a 1-layer student
scores below 1 (better than predicting the teacher's mean), and whether the ranking of the
equal-depth shapes of different widths is the same under every seed.

    python benchmarks/proxy_noise.py --seeds 0 1 2
Writes benchmarks/results/proxy_noise.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

ONE_LAYER = "1x3x96x256"
EQUAL_DEPTH = ("3x3x96x512", "3x6x192x512", "3x12x384x512")


def main() -> int:
    from types import SimpleNamespace

    from kdnas.distill import TeacherCache, load_corpus, load_teacher, parse_arch
    from kdnas.nas import SearchConfig
    from kdnas.nas.trial import SearchContext, proxy_transfer_set

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shapes", nargs="+", default=[ONE_LAYER, *EQUAL_DEPTH])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "proxy_noise.json")
    args = parser.parse_args()

    teacher, texts = load_teacher("minilm-l6"), load_corpus("news")
    runs = []
    for seed in args.seeds:
        cfg = SearchConfig(seed=seed, proxy="hs")
        data = proxy_transfer_set(cfg, teacher, texts)
        ctx = SearchContext(config=cfg, space=None, sizes=teacher.student_sizes(), teacher=teacher, texts=texts,
                            data=data, cache=TeacherCache(teacher, data), teacher_latency_ms=1.0, budget_ms=1.0,
                            progress=SimpleNamespace(phase=lambda *_: None))
        for arch in args.shapes:
            started = time.perf_counter()
            result = ctx.proxy(parse_arch(arch, **teacher.student_sizes()))
            run = {"arch": arch, "seed": seed, "l_hs_norm": round(result.metrics["l_hs_norm"], 4),
                   "l_hs_se": round(result.metrics["l_hs_se"], 4),
                   "seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps(run), flush=True)
            runs.append(run)

    shapes = {}
    for arch in args.shapes:
        values = [r["l_hs_norm"] for r in runs if r["arch"] == arch]
        shapes[arch] = {"mean": round(statistics.mean(values), 4),
                        "std": round(statistics.stdev(values), 4) if len(values) > 1 else None, "runs": values,
                        "mean_se": round(statistics.mean(r["l_hs_se"] for r in runs if r["arch"] == arch), 4)}
    depth = [a for a in EQUAL_DEPTH if a in args.shapes]
    orders = {seed: sorted(depth, key=lambda a: next(r["l_hs_norm"] for r in runs if r["arch"] == a and r["seed"] == seed))
              for seed in args.seeds}
    checks = {"one_layer_below_1": all(v < 1 for v in shapes.get(ONE_LAYER, {}).get("runs", [])),
              "equal_depth_order_stable": len({tuple(o) for o in orders.values()}) == 1,
              "equal_depth_orders": {str(k): v for k, v in orders.items()}}
    defaults = SearchConfig(proxy="hs")
    result = {"proxy": {"proxy": "hs", "method": defaults.method, "init": defaults.init, "steps": defaults.proxy_steps,
                        "train": defaults.proxy_train, "eval": defaults.proxy_eval, "lr": defaults.lr,
                        "batch_size": defaults.batch_size},
              "shapes": shapes, "checks": checks, "runs": runs, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| shape | L_HS mean | seed std | mean SE of one estimate | runs |\n|---|---|---|---|---|")
    for arch, s in shapes.items():
        print(f"| {arch} | {s['mean']:.4f} | {s['std']:.4f} | {s['mean_se']:.4f} | "
              f"{', '.join(f'{v:.4f}' for v in s['runs'])} |")
    print(json.dumps(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
