"""The evaluation cache under `$KDNAS_CACHE`: one file per key (a hash of its JSON), written atomically;
an unreadable entry reads as missing and is recomputed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from kdnas.core import assets
from .tasks import Task


def digest(texts: Sequence[str]) -> str:
    """sha256 over the texts, each ended by a NUL (so ["ab"] and ["a", "b"] differ)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8") + b"\0")
    return h.hexdigest()


def task_key(task: Task) -> dict:
    """Name, source, sizes and a digest of the exact texts and labels (an edited file is re-scored)."""
    content = digest([f"{s}|{y}|{x}" for s in ("train", "test") for x, y in
                      zip(task.split(s).texts, task.split(s).labels)])
    return {"name": task.name, "source": task.source, "sizes": task.sizes(), "labels": list(task.labels),
            "content": content}


def cache_file(folder: str, key: dict, suffix: str) -> Path:
    """`$KDNAS_CACHE/<folder>/<hash of key><suffix>`."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return assets.cache_root() / folder / f"{name}{suffix}"


def read_json(file: Path) -> dict | None:
    try:
        return json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return None  # an unreadable entry is recomputed


def write_json(file: Path, value: dict) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(file)
