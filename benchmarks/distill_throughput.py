"""Student training throughput with the teacher-target cache vs recomputing the teacher each step.

Same student, data, method and steps; the two modes alternate in rounds so machine noise hits
both alike, and the figure reported is the ratio of medians. The cache fill (one teacher pass
over the transfer set) is reported separately: it is paid once per search, not per student.

    python benchmarks/distill_throughput.py                      # CPU, mpnet-base (12-layer) teacher
    python benchmarks/distill_throughput.py --device cuda        # GPU, bf16 autocast
Writes benchmarks/results/distill_throughput[-DEVICE].json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from kdnas.distill import DistillConfig, Evaluator, TeacherCache, distill, load_corpus, load_teacher, make_transfer_set, parse_arch  # noqa: E402
from kdnas.distill.loop import PRECISIONS, resolve_precision  # noqa: E402
from _mfu import known_peak_tflops, mfu, train_flops_per_token  # noqa: E402
from kdnas.latency import cpu_model  # noqa: E402


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="mpnet-base")
    parser.add_argument("--arch", default="4x12x384x1536")
    parser.add_argument("--method", default="hs")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="training precision (the table in docs was measured in fp32; default: %(default)s)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense peak for the training dtype, for MFU (default: known GPUs' bf16 peak)")
    parser.add_argument("--out", default=None)
    return parser.parse_args()


def main() -> None:
    args = _args()
    device = torch.device(args.device)
    teacher = load_teacher(args.teacher, device=device)
    spec = parse_arch(args.arch, **teacher.student_sizes())
    n_train = args.steps * args.batch_size  # every timed step sees distinct rows
    data = make_transfer_set(teacher.tokenizer, load_corpus("news"), seq_len=args.seq_len,
                             num_train=n_train, num_eval=8, seed=0)
    cache = TeacherCache(teacher, data)
    config = DistillConfig(method=args.method, steps=args.steps, batch_size=args.batch_size,
                           device=args.device, precision=args.precision, progress=False)
    from kdnas.distill.methods import build_method
    from kdnas.distill.trainer import spec_dims

    needs = build_method(args.method, teacher.dims, spec_dims(spec)).teacher_needs()
    start = time.perf_counter()
    cache.ensure("train", needs)
    fill_seconds = time.perf_counter() - start
    evaluator = Evaluator(cache)

    # Warm-up once per mode (allocator, kernels), then alternate timed rounds.
    for cached in (True, False):
        distill(spec, teacher, data, dataclasses.replace(config, steps=2),
                cache=cache if cached else None, evaluator=evaluator)
    rates: dict[str, list[float]] = {"cached": [], "live": []}
    for _ in range(args.rounds):
        for mode in ("cached", "live"):
            result = distill(spec, teacher, data, config, cache=cache if mode == "cached" else None, evaluator=evaluator)
            rates[mode].append(result.tokens_per_second)
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    # Model FLOPs per real token of the student alone (the teacher excluded), against the device's peak.
    peak = args.peak_tflops or (known_peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None)
    per_token = train_flops_per_token(spec, args.seq_len)
    report = {
        "benchmark": "distill_throughput",
        "teacher": args.teacher, "teacher_layers": teacher.dims.layers, "student": spec.arch,
        "method": args.method, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "steps_per_round": args.steps, "rounds": args.rounds,
        "tokens_per_second": {"cached": round(median["cached"], 1), "live_teacher": round(median["live"], 1)},
        "all_rounds": {k: [round(v, 1) for v in vals] for k, vals in rates.items()},
        "speedup_cached_vs_live": round(median["cached"] / median["live"], 2),
        "student_train_tflops": {mode: round(rate * per_token / 1e12, 2) for mode, rate in median.items()},
        "peak_tflops": peak,
        "mfu": {mode: round(mfu(rate, spec, args.seq_len, peak), 4) for mode, rate in median.items()} if peak else None,
        "cache_fill_seconds": round(fill_seconds, 2), "cache_bytes": cache.nbytes(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "torch_threads": torch.get_num_threads(), "precision": resolve_precision(args.precision, device),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    out = Path(args.out or Path(__file__).parent / "results" /
               f"distill_throughput{'' if device.type == 'cpu' else '-' + device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
