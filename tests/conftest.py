"""Shared fixtures: the real bundled teacher and corpus, loaded once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def shared_modes():
    """`shared_modes(folder)`: the permission bits its folders and its files have (each a single value
    where all agree, else the set of them), and `umask()` to compare them with (core.files)."""
    import stat

    from kdnas.core.files import umask

    def modes(folder: Path) -> dict:
        found = {"folders": set(), "files": set()}
        for path in [folder, *folder.rglob("*")]:
            found["folders" if path.is_dir() else "files"].add(stat.S_IMODE(path.stat().st_mode))
        return {kind: next(iter(m)) if len(m) == 1 else m for kind, m in found.items()}

    modes.umask = umask
    return modes


@pytest.fixture(scope="session")
def teacher():
    from kdnas.distill import load_teacher

    return load_teacher("minilm-l6")


@pytest.fixture(scope="session")
def news_texts():
    from kdnas.distill import load_corpus

    return load_corpus("news")


@pytest.fixture(scope="session")
def small_data(teacher, news_texts):
    from kdnas.distill import make_transfer_set

    return make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=128, num_eval=32, seed=0)


@pytest.fixture(scope="session")
def minilm_2l(tmp_path_factory) -> str:
    """The bundled MiniLM cut to its first 2 layers: a real pretrained encoder (12 heads) that
    fine-tunes quickly on 2 cores. Saved once per session; tests copy it before changing anything."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from kdnas.core.assets import teacher_path

    hf_logging.set_verbosity_error()
    path = teacher_path("minilm-l6")
    out = tmp_path_factory.mktemp("minilm-2l")
    AutoModel.from_pretrained(path, num_hidden_layers=2).save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return str(out)


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    """A private KDNAS_CACHE so tests never read targets written by another run."""
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path / "kdnas-cache"))
    return tmp_path / "kdnas-cache"


@pytest.fixture(scope="session")
def dashboard():
    """`read(storage)`: start the real optuna-dashboard on a free localhost port against `storage` (an
    Optuna URL, or a journal file's path), and return what its HTTP API says about every study:
    {study name: the study's detail, trials included}. The server is stopped afterwards."""
    import json
    import shutil
    import socket
    import subprocess
    import time
    import urllib.request

    program = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")

    def get(port: int, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return json.loads(response.read())

    def read(storage: str) -> dict[str, dict]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([program, storage, "--host", "127.0.0.1", "--port", str(port), "--quiet"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    studies = get(port, "/api/studies")["study_summaries"]
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(f"optuna-dashboard did not start: {server.stderr.read()[-2000:]}")
                    time.sleep(0.5)
            return {s["study_name"]: get(port, f"/api/studies/{s['study_id']}") for s in studies}
        finally:
            server.terminate()
            server.wait(timeout=30)

    return read
