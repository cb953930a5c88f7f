"""`kdnas export STUDENT_DIR --out DIR`: a deployable, verified ONNX folder."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a student (or teacher) to a verified, optimized ONNX folder",
        description=(
            "Export a BERT-family encoder to ONNX (dynamic batch and sequence axes), check parity with "
            "PyTorch on real sentences (fp32 max-abs <= 1e-4 on unpadded tokens, else nothing is written), "
            "fuse it with onnxruntime's transformer optimizer and count the fused nodes, optionally add a "
            "dynamic INT8 copy with its own cosine check. Writes model.onnx (+ model.int8.onnx), tokenizer "
            "files, config.json and export.json into --out, atomically."
        ),
    )
    parser.add_argument("model", metavar="STUDENT_DIR",
                        help="a transformers model folder, or a bundled teacher (minilm-l6, mpnet-base)")
    parser.add_argument("--out", required=True, help="output folder (created; an earlier export is replaced)")
    parser.add_argument("--int8", action="store_true", help="also write model.int8.onnx (dynamic quantization)")
    parser.add_argument("--int8-fp32-attention", action="store_true",
                        help="keep the fused attention's QKV projection fp32 in model.int8.onnx: slightly "
                             "closer to fp32, much slower (about 1.6x instead of 2.5x faster than fp32 on BERT-base)")
    parser.add_argument("--int8-fp32-embeddings", action="store_true",
                        help="keep the embedding tables fp32 in model.int8.onnx: about three times the file "
                             "(a small student's tables are most of its weights) for a mean cosine 0.0004 closer to fp32")
    parser.add_argument("--int8-full-range", action="store_true",
                        help="quantize weights to the full 8-bit range instead of 7 bits: a little closer to fp32, "
                             "but right only on CPUs with VNNI (AVX512-VNNI, AVX-VNNI, AMX); on others "
                             "onnxruntime's int8 kernel saturates and the graph's outputs can be far off")
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

    from . import export_model

    hf_logging.disable_progress_bar()  # keeps stderr to the one-line error the CLI promises
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # every warning is also in the report, printed below
        report = export_model(args.model, args.out, int8=args.int8,
                              int8_fp32_attention=args.int8_fp32_attention,
                              int8_fp32_embeddings=args.int8_fp32_embeddings, int8_full_range=args.int8_full_range,
                              opset=args.opset, optimize=args.optimize,
                              tokenizer=args.tokenizer, normalize=args.normalize)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    p = report.parity
    print(f"exported {report.source} ({report.model_type} {report.arch}) to {report.out_dir} in {report.seconds:.1f} s")
    print(f"parity vs PyTorch on {p.sentences} sentences: max-abs {p.max_abs:.2e} (tolerance {p.tolerance:.0e}), "
          f"min cosine {p.cosine:.6f}")
    print(f"graph: {report.fusion}")
    normalized = "L2-normalized" if report.normalize else "not normalized"
    print(f"sentence_embedding: {report.pooling} pooling, {normalized}")
    if report.int8_cosine is not None:
        print(f"int8 ({report.int8_recipe}): min cosine to fp32 {report.int8_cosine:.4f} "
              f"(mean {report.int8_mean_cosine:.4f})")
    print("sizes: " + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in report.sizes.items()))
    for note in report.warnings:
        print(f"warning: {note}")
    return 0
