"""Which final recipe? One student shape, several distillation recipes, embedding fidelity after each.

Each recipe is `METHOD[=TERMS]:LAYER_RULE:LR` (e.g. `embed=tok+cos+10*rel:even:3e-4`, `hs:even:3e-4`)
and runs `distill.distill` from the inherited student on one transfer set (`--unit`, `--train`
rows of `--seq-len` tokens) for `--steps` steps of `--batch-size`; every run is scored by
embedding fidelity (Spearman ρ of pairwise cosines vs the teacher, 4,000 pairs of 1,000 held-out
corpus sentences) and the mean cosine to the teacher's embedding. `--checkpoints N` also scores the
student every N steps of the same run; `--precision auto fp32` runs each recipe in both, `--seed 0 1`
with both batch orders, `--augment 0 0.5` without and with half the batches perturbed (distill.augment),
`--weight-decay 0.01 0.1` with each AdamW weight decay.
`--save-every N` saves each run's state every N steps under `--state DIR`; the same command run again
goes on from there (distill.checkpoint) — for a run of hours, stopped by a crash or by the machine going away; a
save is removed once its run's row is written.
`--start DIR` starts every run from a trained student (a `--save` folder) narrowed to `--arch` by activation
importance instead of from the teacher (distill.narrowed_from, what the search's final stage does with a
finalist refused over the budget, which also keeps the word embeddings frozen: `--word-embeddings frozen`):
train wide, then narrow.

    python benchmarks/recipe_sweep.py --arch 3x12x384x1536 --unit sentence --steps 300 \\
        "embed=tok+cos+rel:even:3e-4" "hs:even:3e-4"
Writes benchmarks/results/recipe_sweep.json (appending runs) and prints one line per run; `--save DIR`
keeps each student as a sentence-transformers folder that benchmarks/student_quality.py measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

# --word-embeddings: DistillConfig.freeze_embeddings for each choice (None: distill's own rule)
WORD_EMBEDDINGS = {"default": None, "trained": False, "frozen": True}


def main() -> int:
    from _fidelity_setup import fidelity_setup
    from kdnas.core.errors import InputError
    from kdnas.distill import Checkpoints, DistillConfig, Evaluator, distill, narrowed_from, parse_arch
    from kdnas.distill.augment import WORD_SOURCES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="+")
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--arch", default="3x12x384x1536")
    parser.add_argument("--unit", default="sentence", choices=["sentence", "window"])
    parser.add_argument("--train", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.0, help="student dropout while distilling (-1: BERT's own)")
    parser.add_argument("--checkpoints", type=int, default=0)
    parser.add_argument("--precision", nargs="+", default=["auto"],
                        help="run every recipe in each of these precisions (auto, bf16, fp32), side by side")
    parser.add_argument("--augment", type=float, nargs="+", default=[0.0],
                        help="run every recipe with each of these shares of perturbed batches (distill.augment)")
    parser.add_argument("--augment-words", nargs="+", default=["batch"], choices=WORD_SOURCES,
                        help="run every perturbed recipe with each of these sources of new words (distill.augment)")
    decay = DistillConfig().weight_decay  # one source for the default: the dataclass's
    parser.add_argument("--weight-decay", type=float, nargs="+", default=[decay],
                        help="run every recipe with each of these AdamW weight decays (default: %(default)s)")
    parser.add_argument("--word-embeddings", nargs="+", default=["default"], choices=list(WORD_EMBEDDINGS),
                        help="the word embeddings as `distill` treats them (frozen in an inherited student, trained "
                             "in a --start one), trained with the rest, or frozen (as the search's final stage "
                             "keeps them when it continues a refused finalist)")
    parser.add_argument("--seed", type=int, nargs="+", default=[0],
                        help="run every recipe with each of these seeds (the order of the batches)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "recipe_sweep.json")
    parser.add_argument("--save-every", type=int, default=0,
                        help="save each run's state every N steps under --state; run again to go on (0: never)")
    parser.add_argument("--state", type=Path, default=Path("runs/sweep-state"),
                        help="where --save-every keeps the runs' states (default: %(default)s)")
    parser.add_argument("--start", type=Path, default=None,
                        help="start from this trained student folder, narrowed to --arch (default: the teacher, inherited)")
    parser.add_argument("--save", type=Path, default=None,
                        help="keep each run's student in DIR/<arch>-<steps>-<n> (weights, tokenizer, distill.json), "
                             "so benchmarks/student_quality.py can measure it beside the demo's")
    args = parser.parse_args()
    for wd in args.weight_decay:  # refused before the teacher and its targets load
        try:
            DistillConfig(weight_decay=wd)
        except InputError as err:
            parser.error(f"--weight-decay {wd}: {err}")
    if args.start is not None and not (args.start / "config.json").is_file():
        parser.error(f"--start {args.start}: no saved student there (no config.json); "
                     "allowed: a folder of --save or a search's best/")

    setup = fidelity_setup(args.teacher, args.train, seq_len=args.seq_len, unit=args.unit, on_disk=args.save_every > 0)
    teacher, data, cache = setup.teacher, setup.data, setup.cache
    spec = parse_arch(args.arch, **teacher.student_sizes())

    def score(model) -> dict:
        f = setup.fidelity(model)
        model.train()
        return {"spearman": round(f["spearman"], 4), "mean_cosine": round(f["mean_cosine"], 4)}

    runs, finished = [], []
    for recipe, precision, seed, augment, words, wd, table in [
            (r, p, s, a, w, d, t) for r in args.recipes for p in args.precision for s in args.seed for a in args.augment
            for w in (args.augment_words if a > 0 else ["batch"]) for d in args.weight_decay
            for t in args.word_embeddings]:
        method, rule, lr = recipe.split(":")
        method, _, terms = method.partition("=")
        config = DistillConfig(method=method, steps=args.steps, batch_size=args.batch_size, lr=float(lr),
                               layer_rule=rule, embed_terms=terms or None, progress=False,
                               dropout=None if args.dropout < 0 else args.dropout,
                               eval_every=args.checkpoints, precision=precision, seed=seed, augment=augment,
                               augment_words=words, weight_decay=wd,
                               freeze_embeddings=WORD_EMBEDDINGS[table])
        evaluator = _Scoring(Evaluator(cache, strategy=config.eval_layer_map), score)

        def on_eval(step: int, metrics: dict) -> None:
            if step < args.steps:  # a long run is scored on the way: say so as it goes, not only at its end
                print(json.dumps({"recipe": recipe, "checkpoint": {"step": step, **metrics["fidelity"]},
                                  "seconds": round(time.perf_counter() - started, 1)}), flush=True)

        try:  # the same folder and shape for every run: refused, it is refused before any training
            start = narrowed_from(args.start, teacher.tokenizer, spec, *data.split("train")) if args.start else None
        except InputError as err:
            print(f"recipe_sweep.py: --start {args.start}: {err}", file=sys.stderr)
            return 2
        start_score = score(start) if start is not None else None
        origin = f"-from-{args.start.name}" if args.start else ""
        source = "" if words == "batch" else f"-{words}"  # the names of runs saved before the options stay valid
        source += ("" if wd == decay else f"-wd{wd:g}") + ("" if table == "default" else "-we")
        name = re.sub(r"[^\w.+-]", "_",
                      f"{args.arch}-{args.train}x{args.steps}-{recipe}-{precision}-s{seed}-a{augment}{source}{origin}")
        saves = Checkpoints(args.state / f"{name}.pt", args.save_every) if args.save_every else None
        started = time.perf_counter()
        result = distill(spec, teacher, data, config, cache=cache, evaluator=evaluator, on_eval=on_eval,
                         checkpoints=saves, student=start)
        # the last evaluation is the run's own result, scored below; a resumed run's earlier ones come from its save
        checkpoints = [{"step": h["step"], **h["fidelity"]} for h in result.history if h["step"] < args.steps]
        run = {"recipe": recipe, "arch": args.arch, "unit": args.unit, "train": data.num_train,
               "seq_len": args.seq_len, "steps": args.steps, "batch_size": args.batch_size, "dropout": args.dropout,
               "seed": seed, "augment": augment, "augment_words": words, "weight_decay": wd, "word_embeddings": table,
               "resumed_from": result.resumed_from,
               "precision": result.precision, "seconds": round(time.perf_counter() - started, 1),
               # the steps and evaluations alone (the first run also pays for the teacher's targets); a
               # resumed run's count the seconds before it stopped too
               "loop_seconds": round(result.seconds, 1), "l_hs_norm": round(result.metrics["l_hs_norm"], 4),
               "checkpoints": checkpoints, **score(result.student)}
        if args.start:
            run["start"] = {"from": str(args.start), "narrowed": start_score}
        if args.save is not None:
            folder = args.save / f"{args.arch}-{args.steps}-{len(runs)}"
            run["saved"] = str(save_student(result, data, args.unit, teacher, folder))
        print(json.dumps(run), flush=True)
        runs.append(run)
        if saves is not None:
            finished.append(saves.path)
    previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": previous + [{**r, "environment": environment()} for r in runs]},
                                   indent=2) + "\n")
    for path in finished:  # its row is written: a rerun starts it afresh instead of appending a copy of it
        path.unlink(missing_ok=True)
    return 0


def save_student(result, data, unit: str, teacher, folder: Path) -> Path:
    """The run's student as a loadable folder with the sentence-transformers modules of its teacher and
    the distill.json fields student_quality.py rebuilds its baselines from (the transfer set's shape)."""
    from kdnas.core.assets import teacher_path

    transfer = {"train": data.num_train, "eval": data.num_eval, "seq_len": data.seq_len, "unit": unit}
    return result.save(folder, teacher.tokenizer, extra={"transfer_set": transfer},
                       sentence_from=teacher_path(teacher.name))


class _Scoring:
    """The run's own evaluator, plus embedding fidelity of the student at every evaluation (kept in the
    run's history, so a resumed run still has the scores made before it stopped)."""

    def __init__(self, evaluator, score) -> None:
        self.evaluator, self.score = evaluator, score

    def __call__(self, student, rows=None) -> dict:
        return {**self.evaluator(student, rows), "fidelity": self.score(student)}


if __name__ == "__main__":
    sys.exit(main())
