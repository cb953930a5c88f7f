"""Reproduce Table 1 of the comparative-analysis paper (CPU latency of a teacher and four students).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/latency_table.py [--batch 1 --seq 128 --threads 2]

Five BERT shapes with random weights (values do not change latency) in four flavours: PyTorch eager,
onnxruntime fp32 (plain export), onnxruntime optimized (fused) and onnxruntime INT8 (the recipe of
`kdnas export --int8`). Each graph is exported once; then every (shape, flavour) is measured by
`latency.profile` (its own pinned process, three timed blocks, no cache) in --rounds rounds that
visit all twenty in turn, and the lowest round median is kept, so bursts of other work on the
shared CPU fall on teacher and students alike and the ratios stay meaningful. Then two checks from
issue #3: two `kdnas profile` runs of one shape agree within 5 %, and INT8 is >= 2x faster than
fp32 onnxruntime. Writes benchmarks/results/latency_table.json and prints the README table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kdnas.core.spec import parse_arch
from kdnas.latency import profile
from kdnas.latency._profile import cpu_name, library_versions

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="visits of every (shape, flavour)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    shape = {"batch": args.batch, "seq": args.seq, "threads": args.threads}
    started, load_at_start = time.time(), os.getloadavg()[0]

    table: dict[str, dict] = {arch: {"name": name, "arch": arch, "paper_ms": ms, "paper_speedup": up,
                                     "params_m": round(parse_arch(arch).num_parameters() / 1e6, 1),
                                     "params_no_emb_m": round(parse_arch(arch).num_parameters(False) / 1e6, 1)}
                              for name, arch, ms, up in SHAPES}
    with tempfile.TemporaryDirectory(prefix="kdnas-latency-table-") as tmp:
        targets = {(arch, label): _target(arch, kwargs, Path(tmp)) for label, kwargs in FLAVOURS
                   for _, arch, _, _ in SHAPES}
        rounds: dict[tuple[str, str], list] = {key: [] for key in targets}
        for number in range(args.rounds):
            for (arch, label), (target, kwargs) in targets.items():
                res = profile(target, **shape, **kwargs, use_cache=False)
                rounds[(arch, label)].append(res)
                print(f"round {number + 1}  {label:14s} {arch:15s} median {res.median_ms:8.2f} ms  "
                      f"min {res.min_ms:8.2f}  cv {100 * res.cv:5.1f}%  blocks {res.block_medians}", flush=True)
    for (arch, label), results in rounds.items():
        best = min(results, key=lambda r: (r.noisy, r.median_ms))
        table[arch][label] = {"median_ms": round(best.median_ms, 3), "p90_ms": round(best.p90_ms, 3),
                              "min_ms": round(best.min_ms, 3), "cv": round(best.cv, 4), "runs": best.runs,
                              "noisy": best.noisy, "round_medians_ms": [round(r.median_ms, 3) for r in results]}
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


def _target(arch: str, kwargs: dict, folder: Path) -> tuple[object, dict]:
    """What `profile` measures for one cell: the architecture for torch, an exported graph for onnxruntime."""
    if kwargs["runtime"] == "torch":
        return arch, {"runtime": "torch"}
    from kdnas.core.spec import build_student
    from kdnas.export import export_onnx, quantize_int8

    name = arch + ("-opt" if kwargs["optimized"] else "-plain")
    path = folder / f"{name}.onnx"
    if not path.is_file():
        export_onnx(build_student(parse_arch(arch), seed=0).eval(), path, optimize=kwargs["optimized"])
    if kwargs.get("int8"):
        quantized = folder / f"{name}.int8.onnx"
        quantize_int8(path, quantized)
        path = quantized
    return str(path), {"runtime": "onnxruntime"}


def _repeat_check(arch: str, shape: dict) -> dict:
    """Two `kdnas profile` runs, one after the other, through the real CLI (fresh, no cache)."""
    medians, cvs = [], []
    for _ in range(2):
        argv = [sys.executable, "-m", "kdnas.cli", "profile", arch, "--no-cache", "--json",
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
    sys.exit(main())
