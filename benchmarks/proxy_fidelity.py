"""Does the search's cheap proxy pick the students that turn out best?

For N architectures spread over the search space: distill each with the search's proxy budget
(`nas.config.SearchConfig` defaults: hs, uniform layer map, 60 steps on 96 sequences, batch 8,
seq 64, lr 2e-3) and with a long budget (>= 10x the steps, on a larger transfer set), fine-tune
each long student on a downstream task, and report Kendall's tau-b, with a bootstrap 95 %
interval over architectures, between
  (a) proxy loss and long loss                (both held-out normalized L_HS on the same rows), and
  (b) proxy loss and downstream accuracy      (negated: a lower loss should mean a higher accuracy).
Other proxy settings (more steps, another layer map or method) are scored the same way, so the
report says which setting ranks best; the JSON is benchmarks/results/proxy_fidelity.json.

    python benchmarks/proxy_fidelity.py                          # MiniLM teacher, CPU
    python benchmarks/proxy_fidelity.py --teacher mpnet-base     # on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from distill import DistillConfig, TeacherCache, distill, load_corpus, load_teacher, make_transfer_set, parse_arch  # noqa: E402
from distill.evaluate import Evaluator  # noqa: E402
from distill.finetune import FinetuneConfig, evaluate_model, linear_probe, resolve_model  # noqa: E402
from distill.tasks import load_task  # noqa: E402
from nas.config import SearchConfig  # noqa: E402

# Spread over MiniLM's default space (layers 1-6, heads 4/6/12, hidden 96-384, FFN 256-1536):
# every depth, every head count, every width, small to full FFN.
DEFAULT_ARCHS = ("1x4x96x256", "2x6x192x512", "3x12x96x768", "2x4x384x1024",
                 "4x6x288x768", "5x12x192x1280", "6x4x96x512", "3x6x384x1536")


# --------------------------------------------------------------------------------------------
# rank statistics


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b (ties handled as in scipy.stats.kendalltau); nan when one side is constant."""
    n = len(x)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return (concordant - discordant) / denominator if denominator else float("nan")


def bootstrap_tau(x: list[float], y: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % interval of tau-b over architectures resampled with replacement."""
    rng = random.Random(seed)
    n, taus = len(x), []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        tau = kendall_tau_b([x[i] for i in idx], [y[i] for i in idx])
        if tau == tau:  # skip resamples where one side is constant
            taus.append(tau)
    taus.sort()
    return taus[int(0.025 * len(taus))], taus[int(0.975 * len(taus)) - 1]


def tau_with_interval(x: list[float], y: list[float]) -> dict:
    lo, hi = bootstrap_tau(x, y)
    return {"tau": kendall_tau_b(x, y), "ci95": [lo, hi]}


# --------------------------------------------------------------------------------------------
# the runs


@dataclasses.dataclass(frozen=True)
class Proxy:
    name: str
    method: str
    layer_map: str | None
    steps: int


def main() -> int:
    search = SearchConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default="minilm-l6")
    p.add_argument("--archs", default=",".join(DEFAULT_ARCHS))
    p.add_argument("--long-steps", type=int, default=10 * search.proxy_steps)
    p.add_argument("--long-train", type=int, default=1024, help="transfer sequences for the long runs")
    p.add_argument("--long-lr", type=float, default=1e-3)
    p.add_argument("--eval-rows", type=int, default=64, help="held-out sequences scoring every L_HS")
    p.add_argument("--task", default="sentiment")
    p.add_argument("--ft-train", type=int, default=1000, help="labeled training examples for the probe / fine-tune")
    p.add_argument("--ft-eval", type=int, default=1000)
    p.add_argument("--downstream", default="probe", choices=["probe", "finetune"],
                   help="probe: logistic regression on frozen standardised features (default; see "
                        "distill.finetune.linear_probe for why); finetune: the kdnas evaluate recipe")
    p.add_argument("--ft-epochs", type=int, default=2)
    p.add_argument("--ft-lr", type=float, default=1e-4)
    p.add_argument("--seeds", default="0")
    p.add_argument("--variants", default="hs-short,hs-uniform+last,minilmv2",
                   help="extra proxy settings to compare with the search default (hs, uniform, proxy steps): "
                        "hs-short (a third of the steps), hs-long (3x), hs-uniform+last, minilmv2")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "proxy_fidelity.json"))
    args = p.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 2))

    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if args.long_steps < 10 * search.proxy_steps:
        raise SystemExit(f"--long-steps must be >= 10 x the proxy's {search.proxy_steps} steps")
    proxies = [Proxy("search-default", search.method, search.layer_map, search.proxy_steps)]
    for v in filter(None, args.variants.split(",")):
        if v == "hs-short":  # a third of the steps (20 at the default 60: the default until 2026-11-22)
            proxies.append(Proxy(f"hs-{search.proxy_steps // 3}-steps", "hs", "uniform", max(1, search.proxy_steps // 3)))
        elif v == "hs-long":
            proxies.append(Proxy(f"hs-{3 * search.proxy_steps}-steps", "hs", "uniform", 3 * search.proxy_steps))
        elif v == "hs-uniform+last":
            proxies.append(Proxy("hs-uniform+last", "hs", "uniform+last", search.proxy_steps))
        elif v == "minilmv2":
            proxies.append(Proxy("minilmv2", "minilmv2", None, search.proxy_steps))
        else:
            raise SystemExit(f"unknown variant {v!r}")

    teacher = load_teacher(args.teacher)
    texts = load_corpus(search.corpus)
    # Same held-out rows for every score: make_transfer_set takes them from the first documents.
    proxy_data = make_transfer_set(teacher.tokenizer, texts, seq_len=search.seq_len, num_train=search.proxy_train,
                                   num_eval=args.eval_rows, seed=search.seed)
    long_data = make_transfer_set(teacher.tokenizer, texts, seq_len=search.seq_len, num_train=args.long_train,
                                  num_eval=args.eval_rows, seed=search.seed)
    assert torch.equal(proxy_data.eval_ids, long_data.eval_ids)
    from distill.assets import cache_root

    proxy_cache = TeacherCache(teacher, proxy_data, directory=cache_root() / "targets")
    long_cache = TeacherCache(teacher, long_data, directory=cache_root() / "targets")
    evaluator = Evaluator(long_cache, strategy="uniform")
    task = load_task(args.task)
    ft = FinetuneConfig(lr=args.ft_lr, epochs=args.ft_epochs, max_len=64, train_size=args.ft_train,
                        eval_size=args.ft_eval, seeds=tuple(int(s) for s in args.seeds.split(",")),
                        batch_size=16, device=args.device, progress=False)

    rows = []
    started = time.perf_counter()
    for k, arch in enumerate(archs, 1):
        spec = parse_arch(arch, **teacher.student_sizes())
        row = {"arch": arch, "parameters": spec.num_parameters(), "proxy": {}}
        for proxy in proxies:
            cfg = DistillConfig(method=proxy.method, steps=proxy.steps, batch_size=search.batch_size, lr=search.lr,
                                layer_map=proxy.layer_map, seed=search.seed, device=args.device, progress=False)
            result = distill(spec, teacher, proxy_data, cfg, cache=proxy_cache, evaluator=evaluator)
            row["proxy"][proxy.name] = result.metrics["l_hs_norm"]
        t0 = time.perf_counter()
        long_cfg = DistillConfig(method=search.method, steps=args.long_steps, batch_size=search.batch_size,
                                 lr=args.long_lr, layer_map=search.layer_map, seed=search.seed, device=args.device,
                                 eval_every=search.proxy_steps, progress=True)
        long = distill(spec, teacher, long_data, long_cfg, cache=long_cache, evaluator=evaluator)
        # A free variant: the long run's own loss after the proxy's number of steps.
        row["proxy"]["long-run-prefix"] = long.history[0]["l_hs_norm"]
        row["long_l_hs_norm"] = long.metrics["l_hs_norm"]
        row["long_seconds"] = round(time.perf_counter() - t0, 1)
        with tempfile.TemporaryDirectory() as tmp:
            ref = resolve_model(str(long.save(Path(tmp) / arch, teacher.tokenizer)))
            if args.downstream == "probe":
                runs = [linear_probe(ref, task, train_size=args.ft_train, eval_size=args.ft_eval, seed=s,
                                     device=args.device) for s in ft.seeds]
                acc, f1 = (sum(getattr(r, m) for r in runs) / len(runs) for m in ("accuracy", "macro_f1"))
            else:
                scores = evaluate_model(ref, [task], ft)[task.name]
                acc, f1 = scores.mean("accuracy"), scores.mean("macro_f1")
        row["downstream"] = {"task": task.name, "mode": args.downstream, "accuracy": acc, "macro_f1": f1,
                             "majority": task.test.subsample(args.ft_eval, seed=0).majority_accuracy(),
                             "seeds": list(ft.seeds)}
        rows.append(row)
        print(f"[{k}/{len(archs)}] {arch}: proxy {row['proxy']['search-default']:.4f}  long {row['long_l_hs_norm']:.4f}  "
              f"{task.name} acc {100 * row['downstream']['accuracy']:.1f}  ({time.perf_counter() - started:.0f}s)",
              file=sys.stderr, flush=True)

    long_losses = [r["long_l_hs_norm"] for r in rows]
    neg_acc = [-r["downstream"]["accuracy"] for r in rows]
    fidelity = {}
    for name in rows[0]["proxy"]:
        losses = [r["proxy"][name] for r in rows]
        fidelity[name] = {"vs_long_loss": tau_with_interval(losses, long_losses),
                          "vs_downstream": tau_with_interval(losses, neg_acc)}
    fidelity["long-loss (reference)"] = {"vs_long_loss": {"tau": 1.0, "ci95": [1.0, 1.0]},
                                         "vs_downstream": tau_with_interval(long_losses, neg_acc)}
    best = max((n for n in fidelity if n != "long-loss (reference)"), key=lambda n: fidelity[n]["vs_downstream"]["tau"])
    report = {
        "teacher": args.teacher, "device": "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu",
        "host": platform.node(), "seconds": round(time.perf_counter() - started, 1),
        "search_proxy": {"method": search.method, "layer_map": search.layer_map, "steps": search.proxy_steps,
                         "train": search.proxy_train, "batch": search.batch_size, "seq": search.seq_len, "lr": search.lr},
        "long": {"steps": args.long_steps, "train": args.long_train, "lr": args.long_lr},
        "eval_rows": args.eval_rows,
        "downstream_protocol": {"mode": args.downstream, "task": task.name, **dataclasses.asdict(ft)},
        "proxies": [dataclasses.asdict(p) for p in proxies],
        "architectures": rows, "kendall": fidelity, "best_proxy_vs_downstream": best,
        "note": "tau(proxy, accuracy) uses negated accuracy, so +1 means the lowest loss is the most accurate.",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(report))
    return 0


def table(report: dict) -> str:
    lines = ["| proxy setting | τ vs long L_HS [95 % CI] | τ vs downstream acc [95 % CI] |", "|---|---|---|"]
    for name, f in report["kendall"].items():
        a, b = f["vs_long_loss"], f["vs_downstream"]
        lines.append(f"| {name} | {a['tau']:+.2f} [{a['ci95'][0]:+.2f}, {a['ci95'][1]:+.2f}] | "
                     f"{b['tau']:+.2f} [{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}] |")
    lines += ["", "| arch | proxy L_HS | long L_HS | downstream acc |", "|---|---|---|---|"]
    for r in report["architectures"]:
        lines.append(f"| {r['arch']} | {r['proxy']['search-default']:.4f} | {r['long_l_hs_norm']:.4f} | "
                     f"{100 * r['downstream']['accuracy']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
