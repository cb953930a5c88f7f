"""What every benchmark result records: the machine, the versions and the exact command."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys


def tests_module(name: str):
    """A helper module of the test suite (e.g. `pgserver`, which runs a real PostgreSQL server), loaded
    from its file: the tests folder is not a package, and benchmarks import only the installed kdnas."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tests" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"kdnas_tests_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kdnas(command: list[str]) -> list[str]:
    """`kdnas ...` as this interpreter's module: a benchmark run with the venv's python but without the
    venv on PATH still runs the kdnas it imports. The command recorded stays the one a user types."""
    return [sys.executable, "-m", "kdnas", *command[1:]] if command[:1] == ["kdnas"] else command


def ratio_list(text: str) -> list[float]:
    """An argparse type: budgets as ratios of the teacher's latency, comma-separated, each in (0, 1]."""
    import argparse

    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated ratios of the teacher's latency, e.g. 0.5,0.25")
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each ratio in (0, 1]")
    return values


def environment() -> dict:
    import onnxruntime
    import optuna
    import torch
    import transformers

    from kdnas.distill.loop import native_bf16
    from kdnas.latency import cpu_model

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        # what `--precision auto` trains in here (bf16 where the CPU multiplies bf16 natively)
        "cpu_native_bf16": native_bf16(torch.device("cpu")),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__, "optuna": optuna.__version__,
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
    }


def write_result(path, result: dict) -> None:
    """Write a benchmark's result as JSON with the environment it ran in (after every run, so a long
    benchmark stopped midway keeps what it measured)."""
    import json
    from pathlib import Path

    result["environment"] = environment()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1, default=str) + "\n")
