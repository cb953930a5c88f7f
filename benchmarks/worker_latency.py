"""Latency beside a second worker: does a shape measured while another search worker on the same
host trains read the same as that shape measured alone?

Starts a throw-away PostgreSQL server (Debian's, as the tests do), runs `kdnas search --workers 2`
on it with an empty latency cache — so the teacher and every shape are measured by these workers,
each while the other one works — then measures the teacher and every shape the study measured
again, alone (`latency.profile(..., use_cache=False)`, nothing else of kdnas running), and writes
the ratios study / alone. A ratio near 1 means the workers' training did not disturb the
measurements (it pauses for them: core/quiet.py); the measurement windows in the study are also
checked never to overlap.

    python benchmarks/worker_latency.py     # -> benchmarks/results/worker_latency.json (about 10 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402


def run_workers(url: str, out: Path, cache: Path, trials: int) -> float:
    """`kdnas search --workers 2` on the bundled defaults (fewer trials, no final training)."""
    from kdnas.core.assets import cache_root

    env = {**os.environ, "KDNAS_CACHE": str(cache)}
    if (cache_root() / "assets").is_dir():  # reuse the unpacked assets; the latency cache starts empty
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "assets").symlink_to(cache_root() / "assets")
    argv = [sys.executable, "-m", "kdnas.cli", "search", "--teacher", "minilm-l6", "--corpus", "news",
            "--out", str(out), "--storage", url, "--study-name", "pair", "--trials", str(trials),
            "--final-steps", "0", "--workers", "2", "--no-progress"]
    started = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, check=True)
    return time.perf_counter() - started


def measured_in_study(url: str) -> tuple[dict, list[dict]]:
    """The study's teacher latency record and each shape's first own measurement (not a reuse)."""
    import optuna

    from kdnas.nas.storage import open_storage

    study = optuna.load_study(study_name="pair", storage=open_storage(url))
    shapes, seen = [], set()
    for t in study.trials:
        lat, arch = t.user_attrs.get("latency"), t.user_attrs.get("arch")
        if lat and not lat.get("cached") and "measured_in_trial" not in lat and arch not in seen:
            seen.add(arch)
            shapes.append({"arch": arch, "trial": t.number, **lat})
    return study.user_attrs["teacher_latency"], shapes


def alone(target: str, repeats: int) -> dict:
    """`target` measured `repeats` times afresh, with nothing else of kdnas running: the median."""
    from kdnas.latency import profile

    medians = [profile(target, use_cache=False).median_ms for _ in range(repeats)]
    return {"alone_ms": round(statistics.median(medians), 4), "alone_readings_ms": [round(m, 4) for m in medians]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="solo measurements per shape (median)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "worker_latency.json")
    args = parser.parse_args()
    from _env import tests_module

    temporary_server = tests_module("pgserver").temporary_server  # the tests' real PostgreSQL server

    with tempfile.TemporaryDirectory(prefix="kdnas-wl-") as tmp, temporary_server() as url:
        seconds = run_workers(url, Path(tmp) / "run", Path(tmp) / "cache", args.trials)
        teacher, shapes = measured_in_study(url)
    windows = sorted([tuple(teacher["window"])] + [tuple(s["window"]) for s in shapes])
    rows = [{"target": "minilm-l6 (teacher)", "study_ms": round(teacher["median_ms"], 4), **alone("minilm-l6", args.repeats)}]
    rows += [{"target": s["arch"], "trial": s["trial"], "study_ms": round(s["median_ms"], 4), **alone(s["arch"], args.repeats)}
             for s in shapes]
    for row in rows:
        row["ratio"] = round(row["study_ms"] / row["alone_ms"], 4)
    result = {"seconds_search": round(seconds, 1), "rows": rows,
              "windows_overlap": any(a[1] > b[0] for a, b in zip(windows, windows[1:])),
              "max_abs_deviation": round(max(abs(r["ratio"] - 1) for r in rows), 4),
              "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| target | in the study (ms) | alone (ms) | study / alone |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['target']} | {row['study_ms']:.2f} | {row['alone_ms']:.2f} | {row['ratio']:.3f} |")
    print(f"measurement windows overlap: {result['windows_overlap']}; max deviation {result['max_abs_deviation']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
