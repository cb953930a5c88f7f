"""Is the shipped student a useful model? It, the teacher and two untrained baselines, side by side.

For each student folder written by `kdnas search` (e.g. runs/demo/best) this builds the two untrained
baselines at equal or lower cost — the teacher's first k layers (k: the deepest full-width cut with
no more FLOPs than the student) and the student's own inherited starting point before any training
(rebuilt from its distill.json and checked against it; `evaluation.baselines`, what `kdnas evaluate
--baselines` runs) — and measures every row with `kdnas evaluate`'s measures: embedding fidelity,
linear probes on the full splits and 16-shot, and (--finetune) fine-tuning over 3 seeds. A student that does not beat both baselines on every measure
has failed, and the verdict says so. A student trained on from a refused wider finalist (the search's
fallback, init "continued") has as its untrained start the inheritance of its own shape, as in the
search's table. `--also` measures more models beside them, unjudged: a smaller off-the-shelf model a
user could take instead of distilling (its mean cosine via a fitted map where its width differs, *).

    python benchmarks/student_quality.py runs/demo/best
    python benchmarks/student_quality.py runs/demo/best runs/long/best --finetune
    python benchmarks/student_quality.py runs/mpnet/best --teacher mpnet-base --also minilm-l6
Writes benchmarks/results/student_quality.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

TASKS = ("sentiment", "topic", "tweets")


def refuse_non_students(folders: list[Path]) -> None:
    """One line and exit 2, before any work, for the first folder that is no student (no distill.json)."""
    for folder in folders:
        if not (folder / "distill.json").is_file():
            print(f"student folder {str(folder)!r} has no distill.json; allowed: a folder written by kdnas search "
                  "(OUT/best) or kdnas distill", file=sys.stderr)
            raise SystemExit(2)


def build_baselines(student_dir: Path, teacher_name: str, corpus: str, work: Path) -> dict[str, Path]:
    """Both untrained baselines of `student_dir` (evaluation.baselines, as `kdnas evaluate --baselines`
    builds them), kept under `work`, by row name."""
    from kdnas.evaluation.baselines import build_baselines as rebuild

    refuse_non_students([student_dir])
    built = rebuild(str(student_dir), teacher_name, corpus, seq=128, root=work,
                    log=lambda m: print(m, file=sys.stderr))
    print(f"{student_dir}: {built.start}", file=sys.stderr)
    return {ref.name: Path(ref.path) for ref in built.refs}


def main() -> int:
    from kdnas.core.errors import InputError
    from kdnas.evaluation import FinetuneConfig, evaluate
    from kdnas.evaluation import QualityConfig, resolve_model
    from kdnas.evaluation.baselines import distinct_refs, students_baselines, verdict_lines, with_verdicts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", nargs="+", type=Path, help="student folders; each one's own baselines are built")
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--corpus", default="news")
    parser.add_argument("--finetune", action="store_true", help="also fine-tune every row (3 seeds; slow on CPU)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS, help="default: all three")
    parser.add_argument("--finetune-lr", type=float, default=FinetuneConfig.lr,
                        help="fine-tuning peak learning rate (default: kdnas evaluate's, %(default)s)")
    parser.add_argument("--finetune-train", type=int, default=None,
                        help="fine-tuning examples per task (default: the whole training split)")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the latency column (when the machine is busy: figures would be noise)")
    parser.add_argument("--also", nargs="+", default=[], metavar="MODEL",
                        help="more models measured beside, not judged: a bundled name or a folder (e.g. a smaller "
                             "off-the-shelf model a user could take instead of distilling: minilm-l6 beside an "
                             "mpnet-base student)")
    parser.add_argument("--work", type=Path, default=Path("runs/student-quality"),
                        help="where the baselines are kept, one folder per shape, recipe and transfer set "
                             "(reused by a rerun)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "student_quality.json")
    args = parser.parse_args()
    refuse_non_students(args.students)
    try:  # a typo in --also fails now, not after the baselines are built
        for name in args.also:
            resolve_model(name)
    except InputError as err:
        print(f"student_quality.py: --also: {err}", file=sys.stderr)
        return 2
    # Fine-tuning with unfrozen embeddings, 3 epochs, on the full training splits unless --finetune-train caps them;
    # made before any work, so that a bad rate or size is refused in one line.
    try:
        config = FinetuneConfig(lr=args.finetune_lr, train_size=args.finetune_train, eval_size=None,
                                freeze_embeddings=False, progress=False)
    except InputError as err:
        print(f"student_quality.py: {err}", file=sys.stderr)
        return 2

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    students = [str(s) for s in args.students]
    built = students_baselines(students, args.teacher, args.corpus, seq=128, log=log, root=args.work)
    measures = ("fidelity", "probe") + (("finetune",) if args.finetune else ())
    report = evaluate(students + list(args.also), args.tasks, config, teacher=args.teacher, measures=measures,
                      latency=not args.no_latency, quality=QualityConfig(corpus=args.corpus), log=log,
                      baselines=distinct_refs(built))
    report = with_verdicts(report, built)
    report["environment"] = environment()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report))
    print("\n".join(verdict_lines(report["verdicts"])))
    return 0


def table(report: dict) -> str:
    tasks = list(report["tasks"])
    head = ["model", "latency ms", "fidelity ρ", "mean cos"] + [f"{t} probe" for t in tasks] + \
        [f"{t} 16-shot" for t in tasks] + ["probe gain kept"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["models"]:
        probes = row["probes"]
        cells = [Path(row["model"]).name if "/" in row["model"] else row["model"],
                 f"{row['latency_ms']:.2f}" if row.get("latency_ms") else "-",
                 f"{row['fidelity']['spearman']:.3f}", f"{row['fidelity']['mean_cosine']:.3f}"
                 + ("" if row["fidelity"]["cosine_via"] == "identity" else "*")]  # another width: fitted map
        cells += [f"{100 * probes[t]['full']:.1f}" for t in tasks]
        cells += [f"{100 * probes[t]['few_shot_mean']:.1f} ± {100 * probes[t]['few_shot_std']:.1f}" for t in tasks]
        gain = row.get("probe_gain_kept", {}).get("average")
        cells.append(f"{gain:.1f} %" if gain is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    majority = report["models"][0]["probes"]
    lines.append("| majority class | | | | " + " | ".join(f"{100 * majority[t]['majority']:.1f}" for t in tasks) +
                 " | " + " | ".join("" for _ in tasks) + " | |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
