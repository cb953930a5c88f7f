"""The teacher's graphs and its plans' group order, kept across studies and built once when workers start together.

The teacher's precision plans need its exported fp32 and all-INT8 graphs and its sensitivity pass (each weight
group's effect on the probe's fidelity): about a minute for MiniLM-L6 and several for MPNet on 2 cores, the same
for every search of the same teacher on the same probe sentences. Both are kept in the cache
($KDNAS_CACHE/teacher-plans), keyed by what they depend on — the teacher's weights, its pooling, the INT8 recipe
and the runtime's version, and for the order the probe's sentences too — so a second search spends seconds there.
The latency of a plan is never kept: it is the search's judge's (a reading here, or the target profile's).

Several workers starting one study at once would each build them in one place and remove each other's files; here
one builds under a lock while the others wait, then read what it built (`one_builder`), every file is written whole
(`core.files.staged_folder`, `atomic_write_text`), and each worker writes its plan graphs in a folder of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kdnas.core.files import atomic_write_text


def kept_root() -> Path:
    from kdnas.core.assets import cache_root

    return cache_root() / "teacher-plans"


def _key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def graphs_key(fingerprint: str, pooling: Any, normalize: bool) -> str:
    """What the teacher's exported graphs depend on: its weights, the pipeline they compute, the INT8 recipe and
    the libraries that export and quantize."""
    from kdnas.export import int8_recipe
    from kdnas.latency import library_versions

    return _key({"teacher": fingerprint, "pooling": str(pooling), "normalize": bool(normalize),
                 "int8": int8_recipe(), "versions": library_versions("onnxruntime")})


def order_file(graphs: str, sentences: list[str], max_len: int, full_range: bool) -> Path:
    """Where the group order of the graphs `graphs` (their key) measured on these probe sentences is kept."""
    digest = hashlib.sha256("\n".join(sentences).encode()).hexdigest()
    return kept_root() / f"order-{_key({'graphs': graphs, 'sentences': digest, 'max_len': max_len, 'full_range': full_range})}.json"


@contextlib.contextmanager
def one_builder(kept: Path) -> Iterator[None]:
    """Held by one process at a time on this machine (an advisory lock on a file beside `kept`, what is built): the
    first builds, the others wait and then find what it built."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(kept.with_name(kept.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_order(path: Path) -> list[dict[str, Any]] | None:
    """The kept group order, or None where there is none (or it cannot be read: it is measured again)."""
    try:
        order = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return order if isinstance(order, list) and order and all(isinstance(e, dict) for e in order) else None


def keep_order(path: Path, order: list[dict[str, Any]]) -> None:
    if order and not path.is_file():
        atomic_write_text(path, json.dumps(order))


def own_workdir(folder: Path) -> Path:
    """A folder of this process's own under `folder`, for plan graphs it builds and removes."""
    return folder / f"plans-{socket.gethostname()}-{os.getpid()}"
