"""Reproduce Table 1 of the comparative-analysis paper (CPU latency of a teacher and four students).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/latency_table.py [--batch 1 --seq 128 --threads 2]

Five BERT shapes with random weights (values do not change latency), measured fresh (no cache) with
PyTorch eager, onnxruntime fp32 (plain export), onnxruntime optimized (fused) and onnxruntime INT8
(dynamic, on the fused graph). The five shapes of one flavour run round-robin in one process pinned
to --threads cores, so the teacher/student ratios share the machine's conditions (the CPU is shared). Then two checks from issue #3: two
`kdnas profile` runs of one shape agree within 5 %, and INT8 is >= 2x faster than fp32 onnxruntime.
Writes benchmarks/results/latency_table.json and prints the README table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from distill.spec import parse_arch
from latency._profile import cpu_name, library_versions

# name, architecture, the paper's CPU latency (ms) and teacher/student speed-up.
SHAPES = [
    ("teacher (BERT-base)", "12x12x768x3072", 64.91, 1.0),
    ("6L-DistilBERT", "6x12x768x3072", 33.28, 1.95),
    ("6L", "6x12x384x1536", 11.98, 5.4),
    ("4L", "4x12x576x768", 9.53, 6.8),
    ("3L", "3x12x384x1024", 5.41, 12.0),
]
FLAVOURS = [  # label -> profile() keyword arguments
    ("torch eager", {"runtime": "torch"}),
    ("ort fp32", {"runtime": "onnxruntime", "optimized": False}),
    ("ort optimized", {"runtime": "onnxruntime", "optimized": True}),
    ("ort int8", {"runtime": "onnxruntime", "optimized": True, "int8": True}),
]
OUT = Path(__file__).resolve().parent / "results" / "latency_table.json"
MIN_ROUNDS, MAX_ROUNDS, ROUND_SECONDS = 20, 400, 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    shape = {"batch": args.batch, "seq": args.seq, "threads": args.threads}
    started, load_at_start = time.time(), os.getloadavg()[0]

    table: dict[str, dict] = {arch: {"name": name, "arch": arch, "paper_ms": ms, "paper_speedup": up,
                                     "params_m": round(parse_arch(arch).num_parameters() / 1e6, 1),
                                     "params_no_emb_m": round(parse_arch(arch).num_parameters(False) / 1e6, 1)}
                              for name, arch, ms, up in SHAPES}
    for label, kwargs in FLAVOURS:
        # One pinned process per flavour runs the five models round-robin, so bursts of other work on
        # the shared CPU hit teacher and students alike and the ratios stay meaningful.
        request = {**shape, **kwargs, "archs": [arch for _, arch, _, _ in SHAPES]}
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
        reply = subprocess.run([sys.executable, __file__, "--interleaved-worker"], input=json.dumps(request),
                               capture_output=True, text=True, env=env, check=True)
        for arch, stats in json.loads(reply.stdout.strip().splitlines()[-1]).items():
            table[arch][label] = stats
            print(f"{label:14s} {arch:15s} median {stats['median_ms']:8.2f} ms  min {stats['min_ms']:8.2f}  "
                  f"cv {100 * stats['cv']:5.1f}%  {stats['runs']} runs", flush=True)
    teacher = SHAPES[0][1]
    for row in table.values():
        for label, _ in FLAVOURS:
            row[label]["speedup_vs_teacher"] = round(table[teacher][label]["median_ms"] / row[label]["median_ms"], 2)

    checks = {"repeat_profile": [_repeat_check(arch, shape) for arch in ("6x12x384x1536", teacher)]}
    t = table[teacher]
    checks["int8_teacher_vs_ort_fp32"] = round(t["ort fp32"]["median_ms"] / t["ort int8"]["median_ms"], 2)
    checks["int8_teacher_vs_ort_optimized"] = round(t["ort optimized"]["median_ms"] / t["ort int8"]["median_ms"], 2)

    result = {
        "params": {**shape, "cpu": cpu_name(), "versions": library_versions("onnxruntime"),
                   # The CPU is shared: the 1-minute load average says how busy it was around the run.
                   "load_average_start_end": [round(load_at_start, 2), round(os.getloadavg()[0], 2)],
                   "seconds": round(time.time() - started)},
        "rows": list(table.values()),
        "checks": checks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(markdown(result))
    return 0


def interleaved_worker() -> int:
    """Time several models in turn, one run each per round, until ROUND_SECONDS or MAX_ROUNDS."""
    from latency import _stats, _worker
    from distill.spec import StudentSpec

    request = json.loads(sys.stdin.read())
    threads = request["threads"]
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    runtime = request.get("runtime", "onnxruntime")
    runners = {}
    for arch in request["archs"]:
        one = {"target": {"kind": "spec", "spec": dataclasses.asdict(parse_arch(arch))}, "runtime": runtime,
               "batch": request["batch"], "seq": request["seq"], "threads": threads,
               "optimized": request.get("optimized", False), "int8": request.get("int8", False),
               "vocab_size": StudentSpec.vocab_size}
        build = _worker._torch_runner if runtime == "torch" else _worker._ort_runner
        run_once, fused, tmp = build(one, threads)
        for _ in range(3):
            run_once()  # warm-up
        runners[arch] = (run_once, fused, tmp)
    samples = {arch: [] for arch in runners}
    start = time.perf_counter()
    for _ in range(MAX_ROUNDS):
        for arch, (run_once, _, _) in runners.items():
            t0 = time.perf_counter()
            run_once()
            samples[arch].append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > ROUND_SECONDS and len(samples[arch]) >= MIN_ROUNDS:
            break
    out = {}
    for arch, (_, fused, tmp) in runners.items():
        st = _stats.summarize(samples[arch])
        out[arch] = {"median_ms": round(st.median_ms, 3), "p90_ms": round(st.p90_ms, 3),
                     "min_ms": round(st.min_ms, 3), "cv": round(st.cv, 4), "runs": st.runs, "fused": fused}
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(out))
    return 0


def _repeat_check(arch: str, shape: dict) -> dict:
    """Two `kdnas profile` runs, one after the other, through the real CLI (fresh, no cache)."""
    medians, cvs = [], []
    for _ in range(2):
        argv = [sys.executable, "-m", "nas.cli", "profile", arch, "--no-cache", "--json",
                "--batch", str(shape["batch"]), "--seq", str(shape["seq"]), "--threads", str(shape["threads"])]
        reply = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
        medians.append(round(reply["median_ms"], 3))
        cvs.append(round(reply["cv"], 4))
    diff = abs(medians[0] - medians[1]) / min(medians)
    print(f"repeat {arch}: medians {medians} ms, cv {cvs}, differ by {100 * diff:.1f} %", flush=True)
    return {"arch": arch, "medians_ms": medians, "cv": cvs, "rel_diff": round(diff, 4), "within_5pct": diff <= 0.05}


def markdown(result: dict) -> str:
    p = result["params"]
    lines = [
        f"CPU: {p['cpu']}; batch {p['batch']}, seq {p['seq']}, {p['threads']} threads; "
        + ", ".join(f"{k} {v}" for k, v in p["versions"].items()),
        "",
        "| model | shape | params (M) | paper CPU ms | paper speed-up | torch eager ms | ort fp32 ms "
        "| ort optimized ms | ort int8 ms | speed-up (torch / ort opt / int8) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        ms = [r[label]["median_ms"] for label, _ in FLAVOURS]
        ups = [r[label]["speedup_vs_teacher"] for label in ("torch eager", "ort optimized", "ort int8")]
        lines.append(
            f"| {r['name']} | {r['arch']} | {r['params_m']} | {r['paper_ms']} | {r['paper_speedup']}x | "
            + " | ".join(f"{m:.2f}" for m in ms) + " | " + " / ".join(f"{u:.2f}x" for u in ups) + " |"
        )
    c = result["checks"]
    lines.append("")
    for rep in c["repeat_profile"]:
        lines.append(f"- repeat `kdnas profile {rep['arch']}`: {rep['medians_ms'][0]} vs {rep['medians_ms'][1]} ms "
                     f"(cv {rep['cv'][0]:.1%}, {rep['cv'][1]:.1%}): {rep['rel_diff']:.1%} apart")
    lines.append(f"- INT8 teacher vs fp32 onnxruntime: {c['int8_teacher_vs_ort_fp32']}x "
                 f"(vs optimized fp32: {c['int8_teacher_vs_ort_optimized']}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(interleaved_worker() if sys.argv[1:] == ["--interleaved-worker"] else main())
