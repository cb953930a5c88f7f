"""`kdnas --version`: kdnas's version and the libraries a bug report needs, exit 0, nothing else run."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata

import kdnas.cli


def test_the_console_script_prints_its_version_and_the_installed_libraries():
    import onnxruntime
    import optuna
    import torch
    import transformers

    done = subprocess.run([sys.executable, "-m", "kdnas", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"kdnas {metadata.version('kdnas')} (python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"optuna {optuna.__version__})")


def test_a_library_that_is_missing_is_named_as_such(monkeypatch):
    real = metadata.version

    def version(name: str) -> str:
        if name == "optuna":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(kdnas.cli.metadata, "version", version)
    assert kdnas.cli.version_line().endswith("optuna not installed)")
