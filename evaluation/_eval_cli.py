"""`kdnas evaluate` (is the student any good?) and `kdnas transfer` (XtremeDistil task transfer)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

EVALUATE_EPILOG = """\
what it does:
  Each MODEL (a student folder such as runs/demo/best, or a bundled teacher name) and the --teacher
  are measured three ways (--measures; each reads the sentence embedding, the masked mean of the
  last hidden states):
  fidelity  Spearman's rho between the teacher's and the model's cosine similarities over
            --fidelity-pairs random pairs of --fidelity-sentences held-out sentences of --corpus
            (documents never used for distillation), and the mean cosine between the two
            embeddings of a sentence (through a fitted linear map when the widths differ).
  probe     logistic regression on frozen embeddings (MTEB's classifier), trained on the task's
            full train split and on --shots examples per class (--draws draws), scored on the full
            test split; "probe gain kept" is the share of the teacher's gain over the majority class.
  finetune  fine-tuned with a classification head (masked mean pooling + linear), once per --seeds
            seed, on the task's train examples; accuracy mean ± std over seeds (macro-F1 beside
            it), % of teacher and gain kept.
  Each model's CPU latency (batch 1, --latency-seq tokens, --threads threads, onnxruntime) is
  beside, and its share of the teacher's with the two timed in alternation ("× teacher": on a
  shared host two readings taken apart differ more), so it is the table a deployment decision
  needs. --baselines adds, for each student folder with a distill.json, the two untrained models
  it must beat at equal or lower cost (the teacher's first k layers; its own shape cut from the
  teacher, its start) and a verdict.
  Results are cached in $KDNAS_CACHE/eval and $KDNAS_CACHE/quality per weights, so the teacher is
  measured once for many students.

tasks (bundled, offline; fixed seeded 80/10/10 splits, duplicates removed):
  sentiment  Rotten Tomatoes snippets, rotten/fresh              (10,202 / 1,275 / 1,275)
  topic      BBC news articles, 5 topics                          (1,701 / 212 / 212)
  tweets     self-driving-car tweets, negative/neutral/positive   (29,749 / 3,718 / 3,718)
  or your own: a .csv/.tsv/.json/.jsonl file or a save_to_disk folder with a text column
  (text, sentence, content, document, body, review, tweet) and a label column (label, labels,
  category, sentiment, class, target, topic); a hub dataset name where the network is reachable.

protocol: fine-tuning is CPU-sized by default — at most --train-size training and --eval-size test
examples per task (stratified, the same examples for every model and seed), --finetune-epochs epochs at
--max-len tokens. Use --train-size all --eval-size all for the full splits (a GPU is used when
present). Probes always use the full splits; every measure reads --max-len tokens.

examples:
  kdnas evaluate runs/demo/best                                   (vs minilm-l6, 3 tasks, 3 seeds)
  kdnas evaluate runs/demo/best runs/s4 --tasks sentiment,topic --seeds 0,1 --out eval.json
  kdnas evaluate runs/s4 --measures fidelity,probe                (no fine-tuning: minutes on a CPU)
  kdnas evaluate runs/demo/best --baselines --measures fidelity,probe --card
                                                                  (beside its untrained baselines, into
                                                                  its model card)
  kdnas evaluate --teacher none runs/s4 --tasks ./my_labels.csv --finetune-lr 1e-4 --finetune-epochs 2
"""

TRANSFER_EPILOG = """\
stages (Algorithm 1; each freezes what the previous one learned):
  1 representation  encoder + up-projection   multi-layer hidden + attention loss (Eq. 8-9), unlabeled
  2 logit-head      task head only            task-logit loss (Eq. 12 MSE, or --logit-loss od: Hinton τ)
  3 logit-all       encoder + head            task-logit loss
  4 ce-head         task head only            cross-entropy on labels (Eq. 13)
  5 ce-all          encoder + head            cross-entropy
The teacher is first fine-tuned on the --source task; the student's word embeddings start from the
SVD of the teacher's. The attention loss needs the student to have the teacher's head count (12).

OUT holds the student encoder (an HF folder with the tokenizer), task_head.pt and transfer.json
(teacher and student accuracy on the source test examples, per-stage losses and times).
Then measure task transfer with:  kdnas evaluate OUT --tasks sentiment,topic,tweets

example:
  kdnas transfer --source sentiment --arch 4x12x192x768 --out runs/xd
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from kdnas.core.assets import DEFAULT_TEACHER
    from .finetune import FinetuneConfig

    d = FinetuneConfig()
    p = subparsers.add_parser(
        "evaluate", help="measure teacher and students (embedding fidelity, probes, fine-tuning) and compare them",
        description="How much of the teacher's quality does a student keep? Embedding fidelity to the teacher, "
                    "linear probes and fine-tuning on labeled tasks.",
        epilog=EVALUATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("models", nargs="*", metavar="MODEL", help="student folders (or bundled teacher names) to evaluate")
    p.add_argument("--baselines", action="store_true",
                   help="also measure each student's two untrained baselines at equal or lower cost (the teacher's "
                        "first k layers; the student's shape cut from the teacher, its start), rebuilt from its "
                        "distill.json, and say whether the student is ahead of both on every measure")
    p.add_argument("--teacher", default=DEFAULT_TEACHER,
                   help="reference model for %% of teacher: bundled name or folder; 'none' to skip (default: %(default)s)")
    p.add_argument("--tasks", default="sentiment,topic,tweets",
                   help="comma-separated bundled task names and/or dataset paths (default: %(default)s)")
    _add_quality_flags(p)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated fine-tuning seeds (default: %(default)s)")
    # Fine-tuning's own names: `kdnas distill --lr` / `--batch-size` are the distillation's.
    p.add_argument("--finetune-lr", type=float, default=d.lr,
                   help="fine-tuning's peak learning rate (App. D's 2e-5 under-trains small models in a bundled task's few "
                        "hundred steps; default: %(default)s)")
    p.add_argument("--finetune-batch-size", type=int, default=d.batch_size, help="(default: %(default)s)")
    p.add_argument("--finetune-epochs", type=int, default=d.epochs, help="(default: %(default)s)")
    p.add_argument("--max-len", type=int, default=d.max_len, help="tokens per example, longer ones truncated (default: %(default)s)")
    p.add_argument("--train-size", default=str(d.train_size),
                   help="training examples per task, or 'all' (default: %(default)s)")
    p.add_argument("--eval-size", default=str(d.eval_size), help="test examples per task, or 'all' (default: %(default)s)")
    p.add_argument("--train-embeddings", action="store_true",
                   help="also fine-tune the word embeddings (frozen by default: ~4x cheaper on CPU)")
    _add_run_flags(p)
    p.set_defaults(func=run_evaluate)

    t = subparsers.add_parser(
        "transfer", help="XtremeDistil task-transfer distillation (five progressive stages)",
        description="Distill a student through a fine-tuned teacher's source task (XtremeDistilTransformers).",
        epilog=TRANSFER_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--teacher", default=DEFAULT_TEACHER, help="bundled name or folder (default: %(default)s)")
    t.add_argument("--source", default="sentiment", help="source task to fine-tune the teacher on (default: %(default)s)")
    t.add_argument("--arch", default="4x12x192x768", help="student LAYERSxHEADSxHIDDENxFFN (default: %(default)s)")
    t.add_argument("--stage-steps", default=None,
                   help="steps of the five stages, comma-separated (default: 400,60,150,30,60)")
    t.add_argument("--logit-loss", default="mse", choices=["mse", "od"], help="task-logit loss (default: %(default)s)")
    t.add_argument("--temperature", type=float, default=2.0, help="OD temperature τ for --logit-loss od (default: %(default)s)")
    t.add_argument("--transfer-size", type=int, default=1024, help="unlabeled transfer sequences (default: %(default)s)")
    t.add_argument("--labeled-size", default="2000", help="labeled source examples, or 'all' (default: %(default)s)")
    t.add_argument("--seq-len", type=int, default=64, help="(default: %(default)s)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto")
    t.add_argument("--out", required=True, help="output folder for the student")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=run_transfer)


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """`kdnas evaluate`'s options for latency, cache, device and what it writes."""
    p.add_argument("--no-latency", action="store_true", help="skip the CPU latency column")
    p.add_argument("--latency-seq", type=int, default=128, help="sequence length for latency (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for latency (default: %(default)s)")
    p.add_argument("--no-cache", action="store_true", help="recompute every score (ignore $KDNAS_CACHE/eval and /quality)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: %(default)s)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    p.add_argument("--card", action="store_true",
                   help="also write the table into each student folder's model card (README.md), in a section "
                        "that a later --card run replaces")
    p.add_argument("--json", action="store_true", help="print the JSON on stdout instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_quality_flags(p: argparse.ArgumentParser) -> None:
    """`kdnas evaluate`'s options for the fidelity and probe measures (evaluation.fidelity, evaluation.probe)."""
    from .report import QualityConfig

    q = QualityConfig()
    p.add_argument("--measures", default=None,
                   help="comma-separated, of: fidelity, probe, finetune (default: all three; without a "
                        "teacher, probe,finetune)")
    p.add_argument("--fidelity-sentences", type=int, default=q.fidelity_sentences, metavar="N",
                   help="held-out sentences for fidelity (default: %(default)s)")
    p.add_argument("--fidelity-pairs", type=int, default=q.fidelity_pairs, metavar="N",
                   help="random sentence pairs for fidelity's Spearman rho, >= 100 (default: %(default)s)")
    p.add_argument("--corpus", default=q.corpus,
                   help="corpus whose held-out documents give the fidelity sentences (default: %(default)s)")
    p.add_argument("--shots", type=int, default=q.shots, help="examples per class of a few-shot probe (default: %(default)s)")
    p.add_argument("--draws", type=int, default=q.draws, help="few-shot probe draws (default: %(default)s)")


def _size(text: str, flag: str) -> int | None:
    from kdnas.core.errors import InputError

    if str(text).lower() in ("all", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{flag} {text!r} is invalid: give a number or 'all'") from None


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    from kdnas.core.errors import InputError

    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r} is invalid: give comma-separated integers") from None
    if not values:
        raise InputError(f"{flag} is empty")
    return values


def run_evaluate(args: argparse.Namespace) -> int:
    from kdnas.core.errors import InputError
    from .baselines import distinct_refs, student_folders, students_baselines, verdict_lines, with_verdicts
    from .card import card_folders
    from .finetune import FinetuneConfig
    from .report import MEASURES, QualityConfig, check_measures, evaluate, format_table

    config = FinetuneConfig(
        lr=args.finetune_lr, batch_size=args.finetune_batch_size, epochs=args.finetune_epochs, max_len=args.max_len,
        train_size=_size(args.train_size, "--train-size"), eval_size=_size(args.eval_size, "--eval-size"),
        seeds=_int_list(args.seeds, "--seeds"), device=args.device, progress=not args.quiet,
        freeze_embeddings=not args.train_embeddings,
    )
    teacher = None if args.teacher.lower() == "none" else args.teacher
    if teacher is None and not args.models:
        raise InputError("nothing to evaluate: give at least one MODEL or a --teacher")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise InputError("--tasks is empty; bundled tasks: sentiment, topic, tweets")
    measures = check_measures(args.measures if args.measures is not None else ",".join(MEASURES))
    if args.measures is None and teacher is None:  # fidelity needs a teacher; only an explicit ask is an error
        measures = tuple(m for m in measures if m != "fidelity")
    quality = QualityConfig(corpus=args.corpus, fidelity_sentences=args.fidelity_sentences,
                            fidelity_pairs=args.fidelity_pairs, shots=args.shots, draws=args.draws)
    _check_before_measuring(args)
    cards = card_folders(args.models) if args.card else None  # before the minutes of measuring
    log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    students = student_folders(args.models, log) if args.baselines else []
    built: list = []

    def build() -> list:  # evaluate calls it once the models and tasks are checked: a typo fails first
        built.extend(students_baselines(students, teacher, args.corpus, args.latency_seq, log))
        return distinct_refs(built)

    report = evaluate(args.models, tasks, config, teacher=teacher, latency=not args.no_latency,
                      latency_seq=args.latency_seq, threads=args.threads, cache=not args.no_cache,
                      log=log, measures=measures, quality=quality,
                      baselines=build if students else ())
    report = with_verdicts(report, built) if built else report
    if args.out:
        from kdnas.core.files import atomic_write_text

        atomic_write_text(Path(args.out).expanduser(), json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else
          "\n".join([format_table(report), *verdict_lines(report.get("verdicts", {}))]))
    if cards is not None:
        _write_cards(report, *cards, command="kdnas " + shlex.join(getattr(args, "argv", ["evaluate"])))
    return 0


def _check_before_measuring(args: argparse.Namespace) -> None:
    """What would otherwise fail only after the minutes of measuring: the --out file, the latency settings."""
    from kdnas.core.errors import InputError
    from kdnas.core.files import check_parent_folder

    if args.out:
        if Path(args.out).expanduser().is_dir():
            raise InputError(f"--out {args.out} is a folder; give the path of the JSON file to write")
        check_parent_folder(args.out)
    if not args.no_latency:
        from kdnas.latency import check_settings

        check_settings(1, args.latency_seq, args.threads, "onnxruntime",
                       flags={"seq": "--latency-seq", "threads": "--threads"})


def _write_cards(report: dict, folders: list, left_out: list[str], command: str) -> None:
    """`--card`: the table into each student folder's README.md; said on stderr, with what was left out."""
    from kdnas.latency import cpu_name

    from .card import write_card

    machine = cpu_name()
    for folder in folders:
        path = write_card(folder, report, command, machine=machine)
        print(f"kdnas evaluate: the table is in {path}", file=sys.stderr)
    if left_out:
        print(f"kdnas evaluate: no card for {', '.join(left_out)} (not a folder: a bundled model)", file=sys.stderr)


def run_transfer(args: argparse.Namespace) -> int:
    import dataclasses

    from kdnas.core.files import check_out_folder
    from .task_transfer import STAGES, StageBudget, TransferConfig, task_transfer

    config = TransferConfig(arch=args.arch, logit_loss=args.logit_loss, temperature=args.temperature,
                            transfer_size=args.transfer_size, labeled_size=_size(args.labeled_size, "--labeled-size"),
                            seq_len=args.seq_len, seed=args.seed, device=args.device, progress=not args.quiet)
    if args.stage_steps:
        from kdnas.core.errors import InputError

        steps = _int_list(args.stage_steps, "--stage-steps")
        if len(steps) != len(STAGES):
            raise InputError(f"--stage-steps needs {len(STAGES)} numbers (one per stage), got {len(steps)}")
        config = dataclasses.replace(config, **{
            s.name.replace("-", "_"): StageBudget(n, config.budget(s).lr) for s, n in zip(STAGES, steps)})
    check_out_folder(args.out, "an earlier kdnas transfer result", "transfer.json")  # before the minutes of training
    result = task_transfer(args.teacher, args.source, config)
    out = result.save(args.out)
    t, s = result.teacher_source, result.student_source
    print(f"source task {result.source}: teacher accuracy {100 * t['accuracy']:.1f} (macro-F1 {100 * t['macro_f1']:.1f}), "
          f"student {100 * s['accuracy']:.1f} ({100 * s['macro_f1']:.1f}) = {100 * s['accuracy'] / t['accuracy']:.1f}% "
          f"of teacher, on {t['test_examples']} test examples -> {out}")
    print(f"task transfer: kdnas evaluate {out} --teacher {args.teacher}")
    return 0
