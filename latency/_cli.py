"""`kdnas profile MODEL_OR_ARCH`: CPU latency of one shape."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure CPU inference latency (onnxruntime or torch) of a model or architecture",
        description=(
            "Measure CPU latency in a separate process pinned to --threads cores: warm-up, then three timed "
            "blocks, each run until its median is stable (or a cap); the settled block with the lowest median "
            "is reported (median, p90, min, spread as cv) with every block's median. No block under 10 % cv earns more "
            "blocks and is flagged NOISY if it persists. Folders and architectures are built with "
            "random weights (weights do not change latency) and exported to ONNX. Results are cached under "
            "$KDNAS_CACHE/latency, keyed by shape, runtime, batch, seq, threads, CPU and library versions."
        ),
    )
    parser.add_argument("target", metavar="MODEL_OR_ARCH",
                        help="an .onnx file, a model folder, a bundled teacher (minilm-l6, mpnet-base) "
                             "or an architecture LAYERSxHEADSxHIDDENxFFN, e.g. 4x12x192x768")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length in tokens (default 128)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (= pinned cores; default 2)")
    parser.add_argument("--runtime", choices=("onnxruntime", "onnxruntime-int8", "torch"), default="onnxruntime",
                        help="onnxruntime (default), onnxruntime-int8 (the INT8 graph, as --int8), or PyTorch eager "
                             "for comparison")
    parser.add_argument("--no-optimize", dest="optimized", action="store_false",
                        help="onnxruntime: skip the transformer optimizer (no fused attention)")
    parser.add_argument("--int8", action="store_true", help="onnxruntime: dynamic INT8 quantization, as kdnas export --int8 makes it")
    parser.add_argument("--no-cache", dest="use_cache", action="store_false",
                        help="measure even if a cached result exists (and do not store it)")
    parser.add_argument("--cache-dir", default=None, help="cache folder (default $KDNAS_CACHE/latency)")
    parser.add_argument("--beside", metavar="MODEL_OR_ARCH", default=None,
                        help="time the target side by side with this one (e.g. its teacher) in one process, in "
                             "alternating rounds, and report the ratio: what a budget set as a share of a teacher "
                             "needs on a host whose speed drifts between two separate measurements (never cached)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from . import profile, profile_pair

    if args.int8 and args.runtime == "torch":
        from kdnas.core.errors import InputError

        raise InputError("--int8 with --runtime torch: INT8 is an onnxruntime graph; allowed: --runtime onnxruntime")
    runtime = "onnxruntime-int8" if args.int8 else args.runtime
    if args.beside is not None:  # both graphs on the runtime asked for: INT8 beside INT8
        pair = profile_pair(args.target, args.beside, batch=args.batch, seq=args.seq, threads=args.threads,
                            runtime=runtime, optimized=args.optimized)
        print(json.dumps(pair.to_dict(), indent=2) if args.json else pair.summary())
        return 0
    result = profile(
        args.target, batch=args.batch, seq=args.seq, threads=args.threads, runtime=runtime,
        optimized=args.optimized, cache_dir=args.cache_dir, use_cache=args.use_cache,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.summary())
        print(f"cpu: {result.cpu}; " + ", ".join(f"{k} {v}" for k, v in result.versions.items()))
        if result.fused:
            print("fused: " + ", ".join(f"{k}={v}" for k, v in result.fused.items() if v))
        if result.noisy:
            print(f"warning: spread stayed above 10 % after {result.attempts} attempts; the machine is busy, "
                  "the median may be off")
    return 0
