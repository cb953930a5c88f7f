"""`kdnas export STUDENT_DIR --out DIR`: a deployable, verified ONNX folder, with a precision plan chosen by
measurement (`--int8 auto`). Registered here, above `export` and `latency`: choosing a plan scores graphs on
held-out sentences and times them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

INT8_MODES = ("all", "auto")
RANGES = {"auto": None, "full": True, "7bit": False}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a student (or teacher) to a verified, optimized ONNX folder",
        description=(
            "Export a BERT-family encoder to ONNX (dynamic batch and sequence axes), check parity with "
            "PyTorch on real sentences (fp32 max-abs <= 1e-4 on unpadded tokens, else nothing is written), "
            "fuse it with onnxruntime's transformer optimizer and count the fused nodes, optionally add a "
            "dynamic INT8 copy with its own cosine check. Writes model.onnx (+ model.int8.onnx), tokenizer "
            "files, config.json and export.json into --out, atomically. --int8 auto also chooses a precision "
            "plan (which weight groups stay fp32) for a fidelity target or a latency budget, measured on "
            "held-out sentences and timed on this CPU, and writes it as model.mixed.onnx where it is neither "
            "graph."
        ),
    )
    parser.add_argument("model", metavar="STUDENT_DIR",
                        help="a transformers model folder, or a bundled teacher (minilm-l6, mpnet-base)")
    parser.add_argument("--out", required=True, help="output folder (created; an earlier export is replaced)")
    parser.add_argument("--int8", nargs="?", const="all", default=None, choices=INT8_MODES,
                        help="also write model.int8.onnx (dynamic quantization, every weight group INT8); "
                             "'--int8 auto' also chooses a per-group precision plan for --target-fidelity or "
                             "--budget-ms")
    parser.add_argument("--target-fidelity", type=float, default=None, metavar="RHO",
                        help="with --int8 auto: the fastest plan whose embeddings keep Spearman's rho RHO (0-1] "
                             "to the fp32 graph's on held-out sentences")
    parser.add_argument("--budget-ms", type=float, default=None, metavar="MS",
                        help="with --int8 auto: the closest plan to the fp32 graph that runs within MS "
                             "milliseconds here (batch 1, --seq tokens, --threads threads)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence a plan is timed at (default 128)")
    parser.add_argument("--threads", type=int, default=2, help="threads a plan is timed with (default 2)")
    parser.add_argument("--corpus", default="news",
                        help="corpus whose held-out sentences a plan is scored on (default: the bundled news)")
    parser.add_argument("--int8-range", choices=tuple(RANGES), default="auto",
                        help="INT8 weights' range: full 8 bits (right only on CPUs with VNNI or AMX), 7 bits "
                             "(right everywhere), or auto (default): full where this CPU has VNNI or AMX")
    parser.add_argument("--int8-fp32-attention", action="store_true",
                        help="keep the fused attention's QKV projection fp32 in model.int8.onnx: slightly "
                             "closer to fp32, much slower (about 1.6x instead of 2.5x faster than fp32 on BERT-base)")
    parser.add_argument("--int8-fp32-embeddings", action="store_true",
                        help="keep the embedding tables fp32 in model.int8.onnx: about three times the file "
                             "(a small student's tables are most of its weights) for a mean cosine 0.0004 closer to fp32")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset, 14..20 (default 17)")
    parser.add_argument("--no-optimize", dest="optimize", action="store_false",
                        help="ship the plain exported graph, without onnxruntime's fusions")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder or bundled teacher name, if STUDENT_DIR has no tokenizer files")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="L2-normalize the graph's sentence_embedding (default: as STUDENT_DIR's "
                             "sentence-transformers modules.json says; none: not normalized)")
    parser.add_argument("--json", action="store_true", help="print export.json instead of a summary")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import warnings

    from transformers.utils import logging as hf_logging

    from kdnas.export import export_model

    _check_plan_arguments(args)
    sentences = _plan_sentences(args) if args.int8 == "auto" else None  # a bad --corpus: before anything is written
    hf_logging.disable_progress_bar()  # keeps stderr to the one-line error the CLI promises
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # every warning is also in the report, printed below
        report = export_model(args.model, args.out, int8=args.int8 is not None,
                              int8_fp32_attention=args.int8_fp32_attention,
                              int8_fp32_embeddings=args.int8_fp32_embeddings,
                              int8_full_range=RANGES[args.int8_range],
                              opset=args.opset, optimize=args.optimize,
                              tokenizer=args.tokenizer, normalize=args.normalize)
        choice = _choose_plan(args, report, sentences) if sentences is not None else None
    if args.json:
        print((Path(args.out) / "export.json").read_text().rstrip())
        return 0
    _print_report(report, choice)
    return 0


def _check_plan_arguments(args: argparse.Namespace) -> None:
    """A plan's goal and timing, checked before the export: one line naming the value, nothing written."""
    from kdnas.core.errors import InputError
    from kdnas.export import check_goal
    from kdnas.latency import check_settings

    goal = {"--target-fidelity": args.target_fidelity, "--budget-ms": args.budget_ms}
    if args.int8 != "auto":
        given = [flag for flag, value in goal.items() if value is not None]
        if given:
            raise InputError(f"{given[0]} is the goal of a precision plan: add --int8 auto")
        return
    check_goal(args.target_fidelity, args.budget_ms)
    check_settings(1, args.seq, args.threads, "onnxruntime", {"seq": "--seq", "threads": "--threads"})
    if args.budget_ms is not None:
        _check_budget(args)


def _check_budget(args: argparse.Namespace) -> None:
    """A budget under the fastest plan (every group INT8) is refused before the export: its graph, rebuilt
    from the folder's config with random weights (weights do not change latency), is timed first."""
    from kdnas.core.errors import InputError
    from kdnas.latency import profile

    fastest = profile(args.model, batch=1, seq=args.seq, threads=args.threads, runtime="onnxruntime-int8")
    if fastest.median_ms > args.budget_ms:
        raise InputError(f"--budget-ms {args.budget_ms:g} is under every precision plan of {args.model}: its fastest, "
                         f"every group INT8, reads {fastest.median_ms:.2f} ms here (batch 1, {args.seq} tokens, "
                         f"{args.threads} threads); nothing was written")


def _plan_sentences(args: argparse.Namespace) -> list[str]:
    from kdnas.distill import load_corpus
    from kdnas.distill.data import heldout_sentences

    from .precision import PLAN_SENTENCES

    return heldout_sentences(load_corpus(args.corpus), PLAN_SENTENCES, seed=0)


def _choose_plan(args: argparse.Namespace, report, sentences: list[str]):
    """The plan for the exported folder, scored against its own fp32 graph; a goal no plan meets (the
    budget checked before the export, read over on the exported graph) leaves the export as it is and says
    so in one line (exit 2)."""
    from transformers import AutoTokenizer

    from kdnas.core.errors import InputError
    from kdnas.latency import profile

    from .precision import FP32_GRAPH, FidelityScorer, choose_precision, graph_embeddings

    out = Path(args.out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    reference = graph_embeddings(out / FP32_GRAPH, tokenizer, sentences, max_len=args.seq)
    scorer = FidelityScorer(tokenizer, sentences, {"fp32": reference}, "fp32", max_len=args.seq)

    def latency(graph: Path) -> float:
        return profile(str(graph), batch=1, seq=args.seq, threads=args.threads).median_ms

    choice = choose_precision(out, scorer, latency, budget_ms=args.budget_ms, target_fidelity=args.target_fidelity)
    if choice is None:
        what = (f"--budget-ms {args.budget_ms:g}: even the all-INT8 graph is slower here"
                if args.budget_ms is not None else
                f"--target-fidelity {args.target_fidelity:g}: no plan reaches it")
        raise InputError(f"{what}; {out} holds model.onnx and model.int8.onnx without a plan")
    return choice


def _print_report(report, choice) -> None:
    p = report.parity
    print(f"exported {report.source} ({report.model_type} {report.arch}) to {report.out_dir} in {report.seconds:.1f} s")
    print(f"parity vs PyTorch on {p.sentences} sentences: max-abs {p.max_abs:.2e} (tolerance {p.tolerance:.0e}), "
          f"min cosine {p.cosine:.6f}")
    print(f"graph: {report.fusion}")
    normalized = "L2-normalized" if report.normalize else "not normalized"
    print(f"sentence_embedding: {report.pooling} pooling, {normalized}")
    if report.int8_cosine is not None:
        print(f"int8 ({report.int8_recipe}; {report.int8_range_reason}): min cosine to fp32 {report.int8_cosine:.4f} "
              f"(mean {report.int8_mean_cosine:.4f})")
    if choice is not None:
        goal = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in choice.goal.items())
        print(f"precision plan for {goal}: {choice.label} -> {choice.graph}: rho {choice.fidelity['fp32']:.4f} to "
              f"the fp32 graph at {choice.latency_ms:.2f} ms (all-INT8: rho {choice.int8_fidelity['fp32']:.4f}"
              + (f" at {choice.int8_latency_ms:.2f} ms" if choice.int8_latency_ms is not None else "")
              + f"; {choice.sentences} held-out sentences, {choice.seconds:.0f} s)")
    sizes = json.loads((Path(report.out_dir) / "export.json").read_text()).get("sizes", report.sizes)
    print("sizes: " + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sizes.items()))
    for note in report.warnings:
        print(f"warning: {note}")
