"""Small file helpers: atomic writes (a reader never sees half a page) and a writability check."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from core.errors import InputError


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_writable_dir(path: Path, what: str = "--out", hint: str = "") -> Path:
    """Create `path` if needed and prove a file can be written there; else a one-line user error."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".kdnas-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise InputError(f"{what} {path} is not writable: {err.strerror or err}{hint}") from None
    return path
