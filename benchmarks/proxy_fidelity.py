"""Does the search's proxy rank shapes the way the shipped students turn out?

For >= 12 shapes spread over the default (inherited, head-size-kept) search space, every run goes
through the search's own code: `nas.trial.proxy_transfer_set` and `SearchContext.proxy` with the
`SearchConfig` defaults (inherited start, hs, cross-fitted held-out L_HS on 256 rows) at proxy
lengths --proxy-steps (default 20, 60, 150), and the search's final recipe (`SearchContext.final_config`:
embed on one sentence per row) for --final-steps on the final transfer set, scored by what users get
from the shipped student: embedding fidelity (Spearman rho of pairwise cosines vs the teacher,
`nas.baselines.fidelity_table`'s measure, on held-out sentences). Reports Kendall's tau-b with
bootstrap 95 % intervals over shapes between
  (a) each proxy length's L_HS and the longest proxy's L_HS (does the short proxy agree with a longer one?),
  (b) each proxy length's L_HS and the final student's fidelity (negated: lower loss, higher rho).

    python benchmarks/proxy_fidelity.py                       # 12 shapes, 20/60/150 steps, final 300 steps
    python benchmarks/proxy_fidelity.py --method embed --lr 3e-4 --proxy-steps 60 \
        --final-from benchmarks/results/proxy_fidelity.json --out /tmp/embed_proxy.json  # another proxy, same finals
Writes benchmarks/results/proxy_fidelity.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import environment  # noqa: E402

# Spread over MiniLM's inherited default space (layers 1-6; hidden 96-384 with 3-12 heads of 32;
# FFN 256-1536): every depth, every width, small to full FFN.
DEFAULT_ARCHS = ("1x3x96x256", "1x12x384x1536", "2x6x192x768", "2x12x384x512", "3x3x96x1024", "3x9x288x768",
                 "3x12x384x1536", "4x6x192x1280", "4x12x384x768", "5x9x288x512", "6x3x96x256", "6x6x192x1536")


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


def main() -> int:
    from types import SimpleNamespace

    from distill import TeacherCache, load_corpus, load_teacher, make_transfer_set, parse_arch
    from distill.data import heldout_sentences
    from evaluation.quality import embedding_fidelity, sentence_embeddings
    from nas import SearchConfig
    from nas.baselines import PAIRS
    from nas.trial import SearchContext, proxy_transfer_set

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(DEFAULT_ARCHS))
    parser.add_argument("--proxy-steps", type=int, nargs="+", default=[20, 60, 150])
    parser.add_argument("--final-steps", type=int, default=300)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--method", default=SearchConfig.method, help="the proxy's distillation method")
    parser.add_argument("--lr", type=float, default=SearchConfig.lr, help="the proxy's learning rate")
    parser.add_argument("--final-from", type=Path, default=None,
                        help="take each shape's final fidelity from this earlier result instead of training it again")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "proxy_fidelity.json")
    args = parser.parse_args()

    base = SearchConfig(final_steps=args.final_steps, method=args.method, lr=args.lr)
    earlier = {r["arch"]: r["final"] for r in json.loads(args.final_from.read_text())["rows"]} if args.final_from else {}
    missing = sorted(set(args.archs) - set(earlier)) if args.final_from else []
    if missing or (earlier and next(iter(earlier.values()))["steps"] != args.final_steps):
        parser.error(f"--final-from {args.final_from} lacks {missing or 'final runs of --final-steps'}")
    teacher, texts = load_teacher(base.teacher), load_corpus(base.corpus)
    data = proxy_transfer_set(base, teacher, texts)
    final_data = make_transfer_set(teacher.tokenizer, texts, seq_len=base.seq_len, num_train=base.final_train,
                                   num_eval=base.proxy_eval, seed=base.seed, unit=base.final_unit)
    caches = {"proxy": TeacherCache(teacher, data), "final": TeacherCache(teacher, final_data)}
    sentences = heldout_sentences(texts, args.sentences, seed=base.seed)
    reference = sentence_embeddings(teacher, sentences, max_len=base.latency_seq)

    def context(cfg: SearchConfig) -> SearchContext:
        return SearchContext(config=cfg, space=None, sizes=teacher.student_sizes(), teacher=teacher, texts=texts,
                             data=data, cache=caches["proxy"], teacher_latency_ms=1.0, budget_ms=1.0,
                             progress=SimpleNamespace(phase=lambda *_: None))

    from distill import distill as run_distill

    rows = []
    for arch in args.archs:
        spec = parse_arch(arch, **teacher.student_sizes())
        row: dict = {"arch": arch, "proxy": {}}
        for steps in args.proxy_steps:
            started = time.perf_counter()
            result = context(base.replace(proxy_steps=steps)).proxy(spec)
            row["proxy"][str(steps)] = {"l_hs_norm": round(result.metrics["l_hs_norm"], 4),
                                        "seconds": round(time.perf_counter() - started, 1)}
        if arch in earlier:
            row["final"] = {**earlier[arch], "from": str(args.final_from)}
        else:
            started = time.perf_counter()
            final = run_distill(spec, teacher, final_data, context(base).final_config(), cache=caches["final"])
            emb = sentence_embeddings((final.student.eval(), teacher.tokenizer), sentences, max_len=base.latency_seq)
            fidelity = embedding_fidelity(reference, emb, pairs=PAIRS, seed=base.seed)
            row["final"] = {"steps": args.final_steps, "spearman": round(fidelity["spearman"], 4),
                            "mean_cosine": round(fidelity["mean_cosine"], 4),
                            "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)

    longest = str(max(args.proxy_steps))
    rho = [r["final"]["spearman"] for r in rows]
    taus = {}
    for steps in map(str, args.proxy_steps):
        loss = [r["proxy"][steps]["l_hs_norm"] for r in rows]
        taus[steps] = {"vs_longest_proxy": tau_with_interval(loss, [r["proxy"][longest]["l_hs_norm"] for r in rows]),
                       "vs_final_fidelity": tau_with_interval([-v for v in loss], rho)}
    result = {"proxy": {"method": base.method, "init": base.init, "train": base.proxy_train, "eval": base.proxy_eval,
                        "lr": base.lr, "batch_size": base.batch_size, "steps": args.proxy_steps},
              "final": {"method": base.final_method, "unit": base.final_unit, "train": base.final_train,
                        "steps": args.final_steps, "sentences": len(sentences), "pairs": PAIRS},
              "taus": taus, "rows": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| proxy steps | tau vs longest proxy [95 % CI] | tau vs final fidelity [95 % CI] |\n|---|---|---|")
    for steps, t in taus.items():
        a, b = t["vs_longest_proxy"], t["vs_final_fidelity"]
        print(f"| {steps} | {a['tau']:+.2f} [{a['ci95'][0]:+.2f}, {a['ci95'][1]:+.2f}] "
              f"| {b['tau']:+.2f} [{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
