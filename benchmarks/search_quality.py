"""Search quality: TPE vs random search, and the paper's hand-designed shapes, on one proxy budget.

One run, same teacher, corpus, proxy budget, latency settings and trial count for both samplers:
  - best reward, and trials needed to reach 99 % of it (own best and best of both);
  - the paper's Table 1 students scaled to the teacher, distilled with the same proxy budget, and
    whether the searched Pareto front dominates each (lower loss at equal or lower latency);
  - per-trial wall time split into latency / distillation / export, and the share of trials
    rejected before training (over budget or invalid).

    python benchmarks/search_quality.py                                   # MiniLM teacher, CPU
    python benchmarks/search_quality.py --teacher mpnet-base --device cuda --trials 30

Writes benchmarks/results/search_quality.json (or --json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def trials_to_reach(rewards: list[tuple[int, float]], target: float) -> int | None:
    """1-based count of finished trials until one scores >= target (None: never)."""
    for i, (_, reward) in enumerate(rewards, 1):
        if reward is not None and reward >= target:
            return i
    return None


def threshold(best: float) -> float:
    return best - 0.01 * abs(best)  # 99 % of the best, also meaningful for a negative best


def run_search(config) -> tuple[dict, float]:
    from nas import search

    started = time.perf_counter()
    summary = search(config)
    return summary, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    from nas import SearchConfig
    from nas.records import dominates_point, pareto_front

    d = SearchConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default=d.teacher)
    p.add_argument("--corpus", default=d.corpus)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--budget-ms", type=float, default=None, help="default: the search default (ratio of teacher latency)")
    p.add_argument("--proxy-steps", type=int, default=d.proxy_steps)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "runs" / "bench-search"))
    p.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "search_quality.json"))
    args = p.parse_args(argv)

    out = Path(args.out)
    base = SearchConfig(teacher=args.teacher, corpus=args.corpus, trials=args.trials, budget_ms=args.budget_ms,
                        proxy_steps=args.proxy_steps, device=args.device, seed=args.seed, final_steps=0,
                        progress=sys.stderr.isatty())
    results: dict = {"teacher": args.teacher, "corpus": args.corpus, "trials": args.trials, "device": args.device,
                     "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}, "samplers": {}}
    fronts = {}
    budget = args.budget_ms
    for sampler in ("tpe", "random"):
        config = base.replace(sampler=sampler, out=str(out / sampler), budget_ms=budget, reference=(sampler == "tpe"))
        summary, seconds = run_search(config)
        budget = summary["budget_ms"]  # the random search uses exactly the TPE run's budget
        rows = summary["trials_table"]
        finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED", "FAIL")]
        rewards = [(r["number"], r["reward"]) for r in finished]
        scored = [r for _, r in rewards if r is not None]
        best = max(scored) if scored else None
        results["samplers"][sampler] = {
            "best_reward": best,
            "best_trial": summary["best_trial"],
            "rewards": rewards,
            "trials_to_99pct_own_best": trials_to_reach(rewards, threshold(best)) if best is not None else None,
            "seconds_wall": round(seconds, 1),
            "seconds_per_trial": summary["seconds_per_trial"],
            "rejected_before_training_share": summary["rejected_before_training_share"],
            "counts": summary["counts"],
            "pareto_front": [{"number": r["number"], "arch": r["arch"], "latency_ms": r["latency_median_ms"],
                              "l_hs_norm": r["l_hs_norm"]} for r in pareto_front(rows)],
        }
        fronts[sampler] = pareto_front(rows)
        if sampler == "tpe":
            results["reference"] = summary["reference"]
        results["budget_ms"] = budget
        results["teacher_latency_ms"] = summary["teacher_latency"]["median_ms"]

    overall = max(s["best_reward"] for s in results["samplers"].values() if s["best_reward"] is not None)
    for s in results["samplers"].values():
        s["trials_to_99pct_overall_best"] = trials_to_reach(s["rewards"], threshold(overall))
    union = pareto_front([{**r, "status": "feasible", "l_hs_norm": r["l_hs_norm"],
                           "latency_median_ms": r["latency_median_ms"]} for f in fronts.values() for r in f])
    table = []
    for ref in results.get("reference") or []:
        entry = {k: ref[k] for k in ("name", "arch", "latency_ms", "l_hs_norm", "reward", "within_budget")}
        for label, front in (("tpe", fronts["tpe"]), ("either", union)):
            hit = dominates_point(front, ref["latency_ms"], ref["l_hs_norm"])
            entry[f"dominated_by_{label}"] = None if hit is None else {
                "number": hit["number"], "arch": hit["arch"], "latency_ms": hit["latency_median_ms"],
                "l_hs_norm": hit["l_hs_norm"]}
        table.append(entry)
    results["reference_dominance"] = table
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(markdown(results))
    return 0


def markdown(r: dict) -> str:
    def f(x, spec=".4f"):
        return "–" if x is None else format(x, spec)

    lines = [f"teacher {r['teacher']} ({f(r['teacher_latency_ms'], '.2f')} ms), budget {f(r['budget_ms'], '.2f')} ms, "
             f"{r['trials']} trials each, device {r['device']}", "",
             "| sampler | best reward | best shape | trials to 99 % (own / overall best) | wall s | s/trial latency / distill / export | rejected before training |",
             "|---|---|---|---|---|---|---|"]
    for name, s in r["samplers"].items():
        t = s["seconds_per_trial"]
        best = s["best_trial"] or {}
        lines.append(f"| {name} | {f(s['best_reward'])} | {best.get('arch', '–')} | {s['trials_to_99pct_own_best']} / "
                     f"{s['trials_to_99pct_overall_best']} | {s['seconds_wall']} | {f(t['latency'], '.1f')} / "
                     f"{f(t['distill'], '.1f')} / {f(t['export'], '.1f')} | "
                     f"{f(100 * s['rejected_before_training_share'], '.0f')} % |")
    lines += ["", "| reference (Table 1, scaled) | shape | latency ms | L_HS norm | reward | within budget | dominated by TPE front | by either front |",
              "|---|---|---|---|---|---|---|---|"]
    for e in r["reference_dominance"]:
        def dom(x):
            return "no" if x is None else f"yes: #{x['number']} {x['arch']} ({x['latency_ms']:.2f} ms, {x['l_hs_norm']:.4f})"
        lines.append(f"| {e['name']} | {e['arch']} | {f(e['latency_ms'], '.2f')} | {f(e['l_hs_norm'])} | {f(e['reward'])} | "
                     f"{'yes' if e['within_budget'] else 'no'} | {dom(e['dominated_by_tpe'])} | {dom(e['dominated_by_either'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
