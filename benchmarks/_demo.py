"""The demo's command (`bash dev.sh demo`) as a fresh process with its own cache: what the benchmarks that
time or compare demos run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = ["search", "--teacher", "minilm-l6", "--corpus", "news"]


def run_demo(out: Path, cache: Path, timeout_s: float, extra: list[str]) -> dict:
    """`kdnas search` with the demo's settings, `--timeout timeout_s` and `extra`, into `out` with
    `KDNAS_CACHE=cache`; exits on failure. Returns the command as a user types it (no --out), its wall
    time, stderr, the summary and the shipped student's search.json."""
    command = [*DEMO, "--out", str(out), "--timeout", f"{timeout_s:g}", "--no-progress", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "KDNAS_CACHE": str(cache)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kdnas.cli", *command], cwd=REPO, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"kdnas {' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"command": "kdnas " + " ".join([*DEMO, "--timeout", f"{timeout_s:g}", *extra]), "wall_s": wall,
            "stderr": done.stderr, "summary": json.loads((out / "summary.json").read_text()),
            "final": json.loads((out / "best" / "search.json").read_text())}
