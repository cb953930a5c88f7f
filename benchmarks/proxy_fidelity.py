"""Does the search's proxy rank shapes the way the shipped students turn out?

For >= 12 shapes spread over the default (inherited, head-size-kept) search space, every run goes
through the search's own code (`nas.recipe.proxy_transfer_set`, `SearchContext.proxy`, `nas.proxy.proxy_loss`
with the `SearchConfig` defaults) for both proxies of `kdnas search --proxy`:
  fidelity (default): the final recipe for --fidelity-steps (default 30, 60), scored by embedding
    fidelity on the search's held-out probe sentences (loss = 1 - rho);
  hs (the paper's): hs for --hs-steps (default 20, 60, 150), scored by cross-fitted held-out L_HS;
and the search's final recipe (`SearchContext.final_config`: embed on one sentence per row) for
--final-steps on the final transfer set, scored by what users get from the shipped student:
embedding fidelity on --sentences held-out sentences (disjoint from the probe's). Reports Kendall's
tau-b with bootstrap 95 % intervals over shapes between
  (a) each proxy length's loss and the same proxy's longest run (does the short proxy agree with a longer one?),
  (b) each proxy length's loss and the final student's fidelity (negated: lower loss, higher rho).

    python benchmarks/proxy_fidelity.py        # 12 shapes; both proxies; final 300 steps
    python benchmarks/proxy_fidelity.py --reuse benchmarks/results/proxy_fidelity.json   # only what it lacks
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
    from kdnas.distill.methods import EMBED_DEFAULT_TERMS
    from kdnas.nas import SearchConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(DEFAULT_ARCHS))
    parser.add_argument("--fidelity-steps", type=int, nargs="*", default=[30, 60])
    parser.add_argument("--hs-steps", type=int, nargs="*", default=[20, 60, 150])
    parser.add_argument("--final-steps", type=int, default=300)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--reuse", type=Path, default=None,
                        help="take every proxy run and final run this earlier result holds instead of running it again")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "proxy_fidelity.json")
    args = parser.parse_args()
    steps = {"fidelity": args.fidelity_steps, "hs": args.hs_steps}
    d = SearchConfig()
    earlier = _earlier_rows(args.reuse, args.final_steps, d.final_lr, EMBED_DEFAULT_TERMS) if args.reuse else {}
    rows = Runner(args.final_steps, args.sentences).rows(args.archs, steps, earlier)
    taus = {kind: _taus(rows, kind, lengths) for kind, lengths in steps.items() if lengths}
    result = {"proxies": {kind: _proxy_facts(SearchConfig.from_flags(proxy=kind), steps[kind]) for kind in steps},
              "final": {"method": d.final_method, "unit": d.final_unit, "train": d.final_train,
                        "lr": d.final_lr, "steps": args.final_steps, "sentences": args.sentences},
              "taus": taus, "rows": rows, "environment": environment(),
              # runs taken from an earlier result (same code path and settings) rather than run again
              "reused_from": str(args.reuse) if args.reuse else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| proxy | steps | tau vs the same proxy's longest [95 % CI] | tau vs final fidelity [95 % CI] |\n|---|---|---|---|")
    for kind, by_steps in taus.items():
        for n, t in by_steps.items():
            a, b = t["vs_longest_proxy"], t["vs_final_fidelity"]
            print(f"| {kind} | {n} | {a['tau']:+.2f} [{a['ci95'][0]:+.2f}, {a['ci95'][1]:+.2f}] "
                  f"| {b['tau']:+.2f} [{b['ci95'][0]:+.2f}, {b['ci95'][1]:+.2f}] |")
    return 0


class Runner:
    """Proxy runs of each kind and the final runs, through the search's own code."""

    def __init__(self, final_steps: int, sentences: int) -> None:
        from types import SimpleNamespace

        from kdnas.distill import TeacherCache, load_corpus, load_teacher
        from kdnas.distill.data import heldout_sentences
        from kdnas.distill.methods import EMBED_DEFAULT_TERMS
        from kdnas.evaluation import sentence_embeddings
        from kdnas.nas import SearchConfig
        from kdnas.nas.recipe import final_transfer_set, proxy_transfer_set
        from kdnas.nas.context import SearchContext

        base = SearchConfig.from_flags(final_steps=final_steps, quality_sentences=sentences)
        self.teacher, texts = load_teacher(base.teacher), load_corpus(base.corpus)
        self.contexts = {}
        for kind in ("fidelity", "hs"):
            cfg = base.with_flags(proxy=kind)
            data = proxy_transfer_set(cfg, self.teacher, texts)
            self.contexts[kind] = SearchContext(config=cfg, space=None, sizes=self.teacher.student_sizes(),
                                                teacher=self.teacher, texts=texts, data=data,
                                                cache=TeacherCache(self.teacher, data), teacher_latency_ms=1.0,
                                                budget_ms=1.0, progress=SimpleNamespace(phase=lambda *_: None))
        self.final_cache = TeacherCache(self.teacher, final_transfer_set(base, self.teacher, texts))
        self.sentences = heldout_sentences(texts, sentences, seed=base.seed)  # the probe's come after these
        self.terms = EMBED_DEFAULT_TERMS  # what the search's `embed` runs train with (it sets no terms)
        self.reference = sentence_embeddings(self.teacher, self.sentences, max_len=base.latency.seq)

    def rows(self, archs: list[str], steps: dict[str, list[int]], earlier: dict[str, dict]) -> list[dict]:
        rows = []
        for arch in archs:
            old = earlier.get(arch, {})
            row = {"arch": arch, "proxies": {kind: {str(n): old.get("proxies", {}).get(kind, {}).get(str(n))
                                                    or self.proxy(kind, arch, n) for n in lengths}
                                             for kind, lengths in steps.items()},
                   "final": old.get("final") or self.final(arch)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        return rows

    def proxy(self, kind: str, arch: str, steps: int) -> dict:
        from kdnas.distill import parse_arch
        from kdnas.nas.proxy import proxy_loss

        ctx = self.contexts[kind]
        ctx.config = ctx.config.with_flags(proxy_steps=steps)
        started = time.perf_counter()
        _, metrics = ctx.proxy(parse_arch(arch, **self.teacher.student_sizes()))
        loss, se = proxy_loss(ctx.config, metrics)
        terms = {"terms": self.terms} if kind == "fidelity" else {}  # the fidelity proxy trains `embed`
        return {"loss": round(loss, 4), "loss_se": round(se, 4), "l_hs_norm": round(metrics.l_hs_norm, 4),
                **terms, "seconds": round(time.perf_counter() - started, 1)}

    def final(self, arch: str) -> dict:
        from kdnas.distill import distill as run_distill
        from kdnas.distill import parse_arch
        from kdnas.evaluation import embedding_fidelity, sentence_embeddings
        from kdnas.nas.baselines import PAIRS

        ctx = self.contexts["hs"]
        started = time.perf_counter()
        final = run_distill(parse_arch(arch, **self.teacher.student_sizes()), self.teacher, self.final_cache.data,
                            ctx.final_config(), cache=self.final_cache)
        emb = sentence_embeddings((final.student.eval(), self.teacher.tokenizer), self.sentences,
                                  max_len=ctx.config.latency.seq)
        fidelity = embedding_fidelity(self.reference, emb, pairs=PAIRS, seed=ctx.config.seed)
        return {"steps": ctx.config.final.steps, "lr": ctx.config.final.lr, "terms": self.terms,
                "spearman": round(fidelity["spearman"], 4),
                "mean_cosine": round(fidelity["mean_cosine"], 4), "seconds": round(time.perf_counter() - started, 1)}


# What a run recorded without a learning rate or `embed` terms ran with (the defaults of that day).
UNRECORDED = {"lr": 3e-4, "terms": "tok+cos+rel"}


def _earlier_rows(path: Path, final_steps: int, final_lr: float, terms: str) -> dict[str, dict]:
    """Rows of an earlier result by shape, without the runs made with other settings than today's: a
    final run of other steps, rate or `embed` terms, a fidelity proxy of other terms. A result from before
    both proxies were measured held the hs one as `proxy`."""
    rows = {}
    for row in json.loads(path.read_text())["rows"]:
        proxies = row.get("proxies") or {"hs": {n: {"loss": r["l_hs_norm"], **r} for n, r in row["proxy"].items()}}
        proxies["fidelity"] = {n: r for n, r in proxies.get("fidelity", {}).items()
                               if r.get("terms", UNRECORDED["terms"]) == terms}
        same = (row["final"]["steps"] == final_steps and row["final"].get("lr", UNRECORDED["lr"]) == final_lr
                and row["final"].get("terms", UNRECORDED["terms"]) == terms)
        final = row["final"] if same else None
        rows[row["arch"]] = {"proxies": proxies, "final": final}
    return rows


def _taus(rows: list[dict], kind: str, lengths: list[int]) -> dict:
    longest = str(max(lengths))
    rho = [r["final"]["spearman"] for r in rows]
    out = {}
    for n in map(str, lengths):
        loss = [r["proxies"][kind][n]["loss"] for r in rows]
        out[n] = {"vs_longest_proxy": tau_with_interval(loss, [r["proxies"][kind][longest]["loss"] for r in rows]),
                  "vs_final_fidelity": tau_with_interval([-v for v in loss], rho)}
    return out


def _proxy_facts(cfg, steps: list[int]) -> dict:
    from kdnas.nas.config import PROXY_FINAL_LR

    if cfg.proxy.kind == "fidelity":
        return {"recipe": cfg.final.method, "unit": cfg.final.unit, "train": cfg.final.train, "lr": PROXY_FINAL_LR,
                "batch_size": cfg.final.batch_size, "sentences": cfg.proxy.sentences, "steps": steps}
    return {"method": cfg.proxy.method, "init": cfg.init, "train": cfg.proxy.train, "eval": cfg.proxy.eval,
            "lr": cfg.proxy.lr, "batch_size": cfg.proxy.batch_size, "steps": steps}

if __name__ == "__main__":
    sys.exit(main())
