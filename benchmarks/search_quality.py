"""Search quality: TPE vs random search, and the paper's hand-designed shapes, on one proxy budget.

Same teacher, corpus, proxy budget, latency settings, budget and trial count for every search:
  - TPE and random search on seeds 0..N-1: trials needed to reach 99 % of the best reward that any
    search found, mean ± std over the seeds, and each search's best;
  - TPE on seed 0 without the pruner (when the proxy prunes: `--proxy hs`): does pruning change the
    best shape, and what does it save;
  - TPE on seed 0 with `--objective pareto` (unless `--no-pareto`): a searched front of its own;
  - the paper's Table 1 students scaled to the teacher, distilled with the same proxy budget, and
    whether the searched Pareto front dominates each (lower loss at equal or lower latency);
  - per-trial wall time split into latency / distillation / export, and the share of trials
    rejected before training (over budget or invalid).

    python benchmarks/search_quality.py                       # MiniLM teacher, CPU, 30 trials x 3 seeds
    python benchmarks/search_quality.py --teacher mpnet-base --device cuda

Writes benchmarks/results/search_quality.json (or --json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402


def trials_to_reach(rewards: list[tuple[int, float]], target: float) -> int | None:
    """1-based count of finished trials until one scores >= target (None: never)."""
    for i, (_, reward) in enumerate(rewards, 1):
        if reward is not None and reward >= target:
            return i
    return None


def threshold(best: float) -> float:
    return best - 0.01 * abs(best)  # 99 % of the best, also meaningful for a negative best


def run_search(config) -> tuple[dict, float]:
    from kdnas.nas import search

    started = time.perf_counter()
    summary = search(config).to_json()  # as summary.json holds it
    return summary, time.perf_counter() - started


def summarize(summary: dict, seconds: float) -> dict:
    """One search's figures: its rewards in trial order, best, time, and Pareto front."""
    from kdnas.nas.records import TrialRow, pareto_front

    rows = summary["trials_table"]
    finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED", "FAIL")]
    rewards = [(r["number"], r["reward"]) for r in finished]
    scored = [r for _, r in rewards if r is not None]
    best = max(scored) if scored else None
    return {
        "best_reward": best,
        "best_arch": (summary["best_trial"] or {}).get("arch"),
        "best_trial": summary["best_trial"],
        "rewards": rewards,
        "trials_to_99pct_own_best": trials_to_reach(rewards, threshold(best)) if best is not None else None,
        "seconds_wall": round(seconds, 1),
        "seconds_distill_sum": round(sum(r["seconds_distill"] or 0 for r in rows), 1),
        "seconds_per_trial": summary["seconds_per_trial"],
        "rejected_before_training_share": summary["rejected_before_training_share"],
        "counts": summary["counts"],
        "pareto_front": [{"number": r.number, "arch": r.arch, "latency_ms": r.latency_median_ms,
                          "loss": r.loss, "loss_se": r.loss_se, "l_hs_norm": r.l_hs_norm}
                         for r in pareto_front([TrialRow.from_dict(r) for r in rows])],
    }


def _pruning(pruned: dict, unpruned: dict) -> dict:
    """TPE seed 0 with and without the pruner: the same best shape, and what pruning saved."""
    return {"best_arch_with": pruned["best_arch"], "best_arch_without": unpruned["best_arch"],
            "distill_seconds_with": pruned["seconds_distill_sum"],
            "distill_seconds_without": unpruned["seconds_distill_sum"],
            "same_best_shape": pruned["best_arch"] == unpruned["best_arch"],
            "best_reward_with": pruned["best_reward"], "best_reward_without": unpruned["best_reward"],
            "seconds_with": pruned["seconds_wall"], "seconds_without": unpruned["seconds_wall"],
            "pruned_trials": pruned["counts"].get("pruned", 0)}


def _paired(tpe: dict, random: dict) -> dict:
    """TPE and random search on one seed: both train every shape with the same proxy seed, so their
    rewards share that seed's noise. Trials each needs to reach 99 % of the better of the two."""
    best = max(tpe["best_reward"], random["best_reward"])
    return {"best_reward": best, "tpe_trials": trials_to_reach(tpe["rewards"], threshold(best)),
            "random_trials": trials_to_reach(random["rewards"], threshold(best)),
            "tpe_best": tpe["best_arch"], "random_best": random["best_arch"]}


def mean_std(values: list[float | None]) -> dict:
    """Mean ± std over seeds of the runs that reached the target; those that never did are counted in `never`."""
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "std": None, "never": len(values)}
    mean = sum(got) / len(got)
    std = (sum((v - mean) ** 2 for v in got) / max(1, len(got) - 1)) ** 0.5
    return {"mean": round(mean, 4), "std": round(std, 4), "never": len(values) - len(got)}


def main(argv: list[str] | None = None) -> int:
    from kdnas.nas import SearchConfig

    d = SearchConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default=d.teacher)
    p.add_argument("--corpus", default=d.corpus)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--seeds", type=int, default=3, help="searches per sampler, seeds 0..N-1 (default: %(default)s)")
    p.add_argument("--budget-ms", type=float, default=None, help="default: the search default (ratio of teacher latency)")
    p.add_argument("--proxy", default=d.proxy, help="the search's --proxy (default: %(default)s)")
    p.add_argument("--proxy-steps", type=int, default=None, help="default: the search's for --proxy")
    p.add_argument("--no-pareto", action="store_true", help="skip the --objective pareto search (TPE, seed 0)")
    p.add_argument("--reuse", default=None,
                   help="a result JSON of the same settings: its searches are kept, only the missing ones run")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=str(REPO / "runs" / "bench-search"))
    p.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "search_quality.json"))
    args = p.parse_args(argv)

    base = SearchConfig.from_flags(teacher=args.teacher, corpus=args.corpus, trials=args.trials, budget_ms=args.budget_ms,
                        proxy=args.proxy, proxy_steps=args.proxy_steps, device=args.device, final_steps=0,
                        progress=sys.stderr.isatty())
    results: dict = {"teacher": args.teacher, "corpus": args.corpus, "trials": args.trials, "seeds": args.seeds,
                     "proxy": base.proxy.kind, "proxy_steps": base.proxy.steps, "device": args.device,
                     "environment": environment(), "runs": {}}
    kept = json.loads(Path(args.reuse).read_text()) if args.reuse else {"runs": {}}
    if args.reuse:
        results["reused"] = {"from": args.reuse, "runs": list(kept["runs"]), "environment": kept.get("environment"),
                             "earlier": kept.get("reused")}
        for key in ("reference", "budget_ms", "teacher_latency_ms"):
            results[key] = kept.get(key)
    fronts = {label: _front_rows(run) for label, run in kept["runs"].items()}
    results["runs"].update(kept["runs"])
    budget = results.get("budget_ms", args.budget_ms)
    for label, sampler, seed, prune, objective in _plan(base, args):
        if label in results["runs"]:
            continue
        config = base.with_flags(sampler=sampler, seed=seed, prune=prune, objective=objective, budget_ms=budget,
                              out=str(Path(args.out) / label.replace("/", "-")), reference=(label == "tpe/seed0"))
        print(f"[search_quality] {label}", file=sys.stderr, flush=True)
        summary, seconds = run_search(config)
        budget = summary["budget_ms"]  # every later search uses exactly the first one's budget
        results["runs"][label] = summarize(summary, seconds)
        fronts[label] = _table_rows(summary)
        if label == "tpe/seed0":
            results["reference"] = summary["reference"]
            results["budget_ms"] = budget
            results["teacher_latency_ms"] = summary["teacher_latency"]["median_ms"]
    _compare(results, fronts, args.seeds)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(markdown(results))
    return 0


def _plan(base, args) -> list[tuple[str, str, int, bool, str]]:
    """(label, sampler, seed, pruning, objective): both samplers on every seed; TPE without pruning
    on seed 0 when the proxy prunes at all (the fidelity proxy never does: that run would repeat
    tpe/seed0); TPE with the pareto objective on seed 0."""
    plan = [(f"{sampler}/seed{seed}", sampler, seed, True, "reward")
            for seed in range(args.seeds) for sampler in ("tpe", "random")]
    if base.pruning:
        plan.append(("tpe-no-pruning/seed0", "tpe", 0, False, "reward"))
    if not args.no_pareto:
        plan.append(("tpe-pareto/seed0", "tpe", 0, True, "pareto"))
    return plan


def _table_rows(summary: dict) -> list:
    from kdnas.nas.records import TrialRow

    return [TrialRow.from_dict(r) for r in summary["trials_table"]]


def _front_rows(run: dict) -> list:
    """A kept search's Pareto front as trial rows: the union of the searches' fronts has the same
    front as the union of all their trials, so dominance needs no more than this."""
    from kdnas.nas.records import TrialRow, loss_of

    return [TrialRow(number=r["number"], arch=r["arch"], latency_median_ms=r["latency_ms"], loss=loss_of(r))
            for r in run["pareto_front"]]


def _compare(results: dict, fronts: dict[str, list], seeds: int) -> None:
    """Samplers against each other (trials to 99 % of the best reward any reward search found) and
    the searched fronts against the paper's reference shapes."""
    from kdnas.nas.records import dominates_point, loss_of, pareto_front

    runs = results["runs"]
    reward_runs = {label: r for label, r in runs.items() if "pareto" not in label}
    overall = max(r["best_reward"] for r in reward_runs.values() if r["best_reward"] is not None)
    results["overall_best_reward"] = overall
    for r in runs.values():
        r["trials_to_99pct_overall_best"] = trials_to_reach(r["rewards"], threshold(overall))
    results["samplers"] = {
        sampler: {key: mean_std([runs[f"{sampler}/seed{s}"][key] for s in range(seeds)])
                  for key in ("trials_to_99pct_overall_best", "best_reward", "seconds_wall")}
        for sampler in ("tpe", "random")}
    results["paired"] = [_paired(runs[f"tpe/seed{s}"], runs[f"random/seed{s}"]) for s in range(seeds)]
    if "tpe-no-pruning/seed0" in runs:
        results["pruning"] = _pruning(runs["tpe/seed0"], runs["tpe-no-pruning/seed0"])
    union = [row for label, rows in fronts.items() if label != "tpe-no-pruning/seed0" for row in rows]
    compared = {"tpe": pareto_front(fronts["tpe/seed0"]), "either": pareto_front(union)}
    if "tpe-pareto/seed0" in fronts:
        compared["pareto"] = pareto_front(fronts["tpe-pareto/seed0"])
    table = []
    for ref in results.get("reference") or []:
        entry = {**{k: ref.get(k) for k in ("name", "arch", "latency_ms", "loss_se", "reward", "within_budget")},
                 "loss": loss_of(ref)}
        for label, front in compared.items():
            hit = dominates_point(front, ref["latency_ms"], entry["loss"])
            entry[f"dominated_by_{label}"] = None if hit is None else {
                "number": hit.number, "arch": hit.arch, "latency_ms": hit.latency_median_ms, "loss": hit.loss}
        table.append(entry)
    results["reference_dominance"] = table


def markdown(r: dict) -> str:
    def f(x, spec=".4f"):
        return "–" if x is None else format(x, spec)

    def ms(x):
        return "–" if x["mean"] is None else f"{x['mean']:.1f} ± {x['std']:.1f}" + (f" ({x['never']} never)" if x["never"] else "")

    lines = [f"teacher {r['teacher']} ({f(r['teacher_latency_ms'], '.2f')} ms), budget {f(r['budget_ms'], '.2f')} ms, "
             f"{r['trials']} trials per search, {r['seeds']} seeds per sampler, device {r['device']}; "
             f"best reward of all searches {f(r['overall_best_reward'])}", "",
             "| sampler | trials to 99 % of the overall best (mean ± std) | best reward (mean ± std) | wall s per search |",
             "|---|---|---|---|"]
    for name, s in r["samplers"].items():
        b = s["best_reward"]
        lines.append(f"| {name} | {ms(s['trials_to_99pct_overall_best'])} | {f(b['mean'])} ± {f(b['std'])} | "
                     f"{f(s['seconds_wall']['mean'], '.0f')} |")
    lines += ["", "| seed | better best reward | TPE reaches 99 % of it in | random in |", "|---|---|---|---|"]
    lines += [f"| {i} | {f(p['best_reward'])} | {p['tpe_trials'] or 'never'} | {p['random_trials'] or 'never'} |"
              for i, p in enumerate(r["paired"])]
    lines += ["", "| search | best shape | best reward | trials to 99 % (own / overall best) | wall s | pruned | rejected before training |",
              "|---|---|---|---|---|---|---|"]
    for label, s in r["runs"].items():
        lines.append(f"| {label} | {s['best_arch']} | {f(s['best_reward'])} | {s['trials_to_99pct_own_best']} / "
                     f"{s['trials_to_99pct_overall_best']} | {s['seconds_wall']} | {s['counts'].get('pruned', 0)} | "
                     f"{f(100 * s['rejected_before_training_share'], '.0f')} % |")
    by = [k for k in ("tpe", "pareto", "either") if any(f"dominated_by_{k}" in e for e in r["reference_dominance"])]
    names = {"tpe": "dominated by TPE seed 0", "pareto": "by the pareto search", "either": "by any search"}
    lines += ["", "| reference (Table 1, scaled) | shape | latency ms | proxy loss | reward | within budget | "
              + " | ".join(names[k] for k in by) + " |", "|---|---|---|---|---|---|" + "---|" * len(by)]

    def dom(x):
        return "no" if x is None else f"yes: #{x['number']} {x['arch']} ({x['latency_ms']:.2f} ms, {x['loss']:.4f})"

    for e in r["reference_dominance"]:
        lines.append(f"| {e['name']} | {e['arch']} | {f(e['latency_ms'], '.2f')} | {f(e['loss'])} | {f(e['reward'])} | "
                     f"{'yes' if e['within_budget'] else 'no'} | " + " | ".join(dom(e.get(f"dominated_by_{k}")) for k in by) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
