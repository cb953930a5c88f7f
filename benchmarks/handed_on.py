"""A finalist refused as shipped hands its training on: its narrower neighbour continued from it vs from the teacher.

The final stage (nas.final) trains a finalist, reads its shipped graph over the budget, and trains
the next candidate, its narrower FFN neighbour, which continues the refused student's training
narrowed by activation importance (`distill.narrowed`). This measures that start against the
one it replaced, the neighbour inherited from the teacher, after the same number of steps of the
final recipe (fp32, `embed` with `--terms` (default: its own), batch 32, `--lr` (default: the
search's final_lr), 7,680 news sentences, seed 0):

    python benchmarks/handed_on.py --wide-steps 680 --steps 0 20 100 --lr 3e-4 --terms tok+cos+rel
    python benchmarks/handed_on.py --wide-steps 1200 --steps 1200 --no-fresh --lr 3e-4 --terms tok+cos+rel
    python benchmarks/handed_on.py --wide-steps 680 --steps 0 20 100

Each run of the wide student ends its own schedule at `--wide-steps` (as a run cut by --timeout
does); each neighbour run is its own schedule of `--steps`. Every student is scored by embedding
fidelity (Spearman ρ of pairwise cosines vs the teacher on 1,000 held-out sentences). Appends to
benchmarks/results/handed_on.json and prints one line per student.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402


def main() -> int:
    from _fidelity_setup import fidelity_setup
    from kdnas.distill import DistillConfig, distill, narrowed, parse_arch
    from kdnas.core.errors import InputError
    from kdnas.distill.methods import EMBED_DEFAULT_TERMS, weighted_embed_terms
    from kdnas.nas import SearchConfig

    def terms(text: str) -> str:  # checked before anything loads: one line from argparse
        try:
            weighted_embed_terms(text)
        except InputError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wide", default="3x12x384x1536")
    parser.add_argument("--narrow", default="3x12x384x1280")
    parser.add_argument("--wide-steps", type=int, default=680)
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 20, 100])
    parser.add_argument("--train", type=int, default=7680)
    parser.add_argument("--lr", type=float, default=SearchConfig().final_lr, help="peak learning rate of every run")
    parser.add_argument("--terms", type=terms, default=EMBED_DEFAULT_TERMS, help="embed's loss terms in every run (its default)")
    parser.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                        help="also train the neighbour from the teacher for the same steps (the start it replaced)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "handed_on.json")
    args = parser.parse_args()

    setup = fidelity_setup("minilm-l6", args.train)
    teacher, data, cache = setup.teacher, setup.data, setup.cache
    wide, narrow = (parse_arch(a, **teacher.student_sizes()) for a in (args.wide, args.narrow))
    config = DistillConfig(method="embed", steps=args.wide_steps, batch_size=32, lr=args.lr, layer_rule="even",
                           dropout=0.0, precision="fp32", progress=False, embed_terms=args.terms)
    ids, mask = data.split("train")

    def rho(model) -> float:
        return round(setup.spearman(model), 4)

    def row(start: str, steps: int, student=None, seconds: float = 0.0) -> dict:
        run = {"start": start, "arch": args.narrow, "steps": steps, "lr": args.lr, "terms": args.terms,
               "seconds": round(seconds, 1)}
        if steps:
            # as nas.final continues it: the word embeddings stay frozen, as in the run it continues
            frozen = True if student is not None else None
            continued = dataclasses.replace(config, steps=steps, freeze_embeddings=frozen)
            result = distill(narrow, teacher, data, continued, cache=cache, student=student)
            student, run["seconds"] = result.student, round(result.seconds, 1)
        run["spearman"] = rho(student)
        print(json.dumps(run), flush=True)
        return run

    runs = []
    trained = distill(wide, teacher, data, config, cache=cache)
    runs.append({"start": "inherited", "arch": args.wide, "steps": args.wide_steps, "lr": args.lr,
                 "terms": args.terms, "seconds": round(trained.seconds, 1), "spearman": rho(trained.student)})
    print(json.dumps(runs[-1]), flush=True)
    for steps in args.steps:
        started = time.perf_counter()
        student, _ = narrowed(trained.student, teacher.tokenizer, narrow, ids, mask)
        runs.append(row(f"{args.wide} after {args.wide_steps} steps, narrowed", steps, student.train(),
                        time.perf_counter() - started))
        if steps and args.fresh:
            runs.append(row("inherited from the teacher", steps))
    previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": previous + [{**r, "environment": environment()} for r in runs]},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
