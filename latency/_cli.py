"""`kdnas profile MODEL_OR_ARCH`: CPU latency of one shape."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


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
    parser.add_argument("target_arg", metavar="MODEL_OR_ARCH",
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
    parser.add_argument("--target", metavar="FILE", default=None,
                        help="check a target profile (`kdnas target --out FILE`): print its prediction for the graph "
                             "beside a reading taken here beside the profile's teacher, on the profile's scale of it")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from . import profile, profile_pair

    if args.int8 and args.runtime == "torch":
        from kdnas.core.errors import InputError

        raise InputError("--int8 with --runtime torch: INT8 is an onnxruntime graph; allowed: --runtime onnxruntime")
    runtime = "onnxruntime-int8" if args.int8 else args.runtime
    if args.target is not None:
        return _against_target(args)
    if args.beside is not None:  # both graphs on the runtime asked for: INT8 beside INT8
        pair = profile_pair(args.target_arg, args.beside, batch=args.batch, seq=args.seq, threads=args.threads,
                            runtime=runtime, optimized=args.optimized)
        print(json.dumps(pair.to_dict(), indent=2) if args.json else pair.summary())
        return 0
    result = profile(
        args.target_arg, batch=args.batch, seq=args.seq, threads=args.threads, runtime=runtime,
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


def _against_target(args: argparse.Namespace) -> int:
    """`--target FILE`: the profile's prediction for the graph beside a reading of it next to the teacher's fp32
    graph, the reading put on the profile's scale of the teacher (ratio x the profile's teacher milliseconds)."""
    from kdnas.core.errors import InputError

    from . import Host, Settings, load_profile, profile_pair, random_weight_graph
    from ._composition import Composition
    from ._model import Shape
    from ._profile import _resolve

    target = load_profile(args.target)
    if args.runtime != "onnxruntime" or args.beside is not None:
        raise InputError("--target reads the graph beside the profile's teacher on onnxruntime; allowed: no --runtime "
                         "or --beside with it (--int8 for a shape's all-INT8 graph)")
    if (reason := target.mismatch(Settings(args.batch, args.seq, args.threads))) is not None:
        raise InputError(f"--target {args.target}: {reason}; give the profile's --batch, --seq and --threads")
    resolved = _resolve(args.target_arg)
    if resolved["kind"] == "onnx":
        graph = resolved["worker"]["path"]
        guess = target.predict_graph(graph)
    else:
        from kdnas.core.spec import parse_arch

        shape = Shape.of(parse_arch(args.target_arg)) if resolved["kind"] == "spec" else \
            Shape.of_config(json.loads((Path(resolved["worker"]["path"]) / "config.json").read_text()))
        guess = target.predict(Composition.of_arch(shape, int8=args.int8))
        graph = random_weight_graph(args.target_arg, int8=args.int8, optimized=args.optimized)
    pair = profile_pair(graph, random_weight_graph(target.teacher), batch=args.batch, seq=args.seq,
                        threads=args.threads)
    read_ms = pair.ratio * target.teacher_ms
    here = Host.here().same_machine(target.host)
    result = {"graph": str(args.target_arg), "predicted_ms": round(guess.ms, 4),
              "interval_ms": [round(guess.low, 4), round(guess.high, 4)], "median_ms": round(read_ms, 4),
              "ratio_to_teacher": round(pair.ratio, 4), "ratio_quartiles": [round(pair.ratio_low, 4),
                                                                           round(pair.ratio_high, 4)],
              "read_ms": round(pair.target_ms, 4), "error": round(guess.ms / read_ms - 1, 4),
              "on_the_profiles_host": here, "profile_cpu": target.host.cpu}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.target_arg}: predicted {guess.ms:.2f} ms ({guess.low:.2f}-{guess.high:.2f}); read {read_ms:.2f} ms "
          f"beside the teacher ({pair.ratio:.3f}x its {target.teacher_ms:.2f} ms in the profile; quartiles "
          f"{pair.ratio_low:.3f}-{pair.ratio_high:.3f}): the prediction is {100 * result['error']:+.1f} %")
    if not here:
        print(f"note: this host is not the profile's ({target.host.cpu}): the reading checks the profile on this CPU")
    return 0

