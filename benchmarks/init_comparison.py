"""How should a student start? `--init inherit` vs `svd` vs `random`, three shapes, equal steps.

Every run is `kdnas distill`'s code path with the search's final recipe (method embed, one sentence
per row, batch 32, lr 3e-4, dropout off) for the same number of steps on the same transfer set;
only the initialisation differs. Each row reports held-out L_HS, embedding fidelity (Spearman ρ of
pairwise cosines vs the teacher on held-out corpus sentences) before and after training, and
16-shot linear probes (10 draws, full test splits) on the three bundled tasks.

    python benchmarks/init_comparison.py --steps 150
Writes benchmarks/results/init_comparison.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

SHAPES = ("3x12x384x1536", "4x6x288x768", "2x4x192x512")
INITS = ("inherit", "svd", "random")
TASKS = ("sentiment", "topic", "tweets")


def main() -> int:
    import torch

    from _fidelity_setup import fidelity_setup
    from kdnas.distill import DistillConfig, distill, parse_arch
    from kdnas.distill.trainer import initial_student

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--train", type=int, default=4096)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "init_comparison.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    setup = fidelity_setup(args.teacher, args.train)
    teacher, data, cache, sentences = setup.teacher, setup.data, setup.cache, setup.sentences
    rows = []
    for arch in args.shapes.split(","):
        spec = parse_arch(arch, **teacher.student_sizes())
        for init in INITS:
            config = DistillConfig(method="embed", steps=args.steps, batch_size=32, lr=3e-4, init=init,
                                   progress=False)
            before, _ = initial_student(spec, teacher, cache, config)
            rho_before = setup.spearman(before)
            started = time.perf_counter()
            result = distill(spec, teacher, data, config, cache=cache)
            seconds = time.perf_counter() - started
            after = setup.fidelity(result.student)
            row = {"arch": arch, "init": init, "init_record": result.init, "steps": args.steps,
                   "l_hs_norm": result.metrics["l_hs_norm"], "fidelity_before": rho_before,
                   "fidelity": after["spearman"], "mean_cosine": after["mean_cosine"],
                   "cosine_via": after["cosine_via"], "train_seconds": round(seconds, 1),
                   "probes_16_shot": few_shot_probes(result, teacher)}
            rows.append(row)
            print(f"{arch} {init}: L_HS {row['l_hs_norm']:.4f} rho {rho_before:.3f} -> {row['fidelity']:.3f} "
                  f"probes {row['probes_16_shot']}", file=sys.stderr, flush=True)
    report = {"protocol": {"method": "embed", "unit": "sentence", "seq_len": 64, "train": data.num_train,
                           "batch_size": 32, "lr": 3e-4, "steps": args.steps, "fidelity_sentences": len(sentences),
                           "probe": "16-shot logistic regression, 10 draws, full test splits"},
              "rows": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report))
    return 0


def few_shot_probes(result, teacher) -> dict[str, float]:
    """16-shot probe accuracy per task (the student saved to a temporary folder, as users load it)."""
    from kdnas.evaluation import resolve_model
    from kdnas.evaluation import probe_scores
    from kdnas.evaluation.tasks import load_task

    with tempfile.TemporaryDirectory() as folder:
        result.student.save_pretrained(folder)
        teacher.tokenizer.save_pretrained(folder)
        ref = resolve_model(folder)
        return {t: round(probe_scores(ref, load_task(t), full=False, cache=False)["few_shot_mean"], 4) for t in TASKS}


def table(report: dict) -> str:
    lines = ["| shape | init | held-out L_HS | fidelity ρ before → after | mean cos | "
             + " | ".join(f"{t} 16-shot" for t in TASKS) + " |", "|" + "---|" * (5 + len(TASKS))]
    for r in report["rows"]:
        lines.append(f"| {r['arch']} | {r['init']} | {r['l_hs_norm']:.3f} | {r['fidelity_before']:.3f} → "
                     f"{r['fidelity']:.3f} | {r['mean_cosine']:.3f} | "
                     + " | ".join(f"{100 * r['probes_16_shot'][t]:.1f}" for t in TASKS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
