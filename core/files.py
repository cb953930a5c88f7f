"""Files kdnas hands to its users: written whole or not at all, and readable like any file they make.

A temporary file (`tempfile.mkstemp`) or folder (`mkdtemp`) is private to its owner (0600 / 0700),
and so is what the safetensors writer makes. Renamed into place, they would ship a model folder that
another account — a service user, a container's non-root user — cannot read. So what is finished
gets the permissions an ordinary `open()` / `mkdir()` gives under the process's umask.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError


def umask() -> int:
    """The process's umask, read without changing it where Linux reports it (os.umask can only set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_shared(path: str | os.PathLike) -> Path:
    """Give `path` — a file, or a folder and everything below it — the permissions `open()` and
    `mkdir()` would have given it (0666 / 0777 less the umask)."""
    path, mask = Path(path), umask()
    for item in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not item.is_symlink():
            item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` (UTF-8) through a temporary file renamed over it: a reader sees the old
    file or the new one, never half of one; its folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        make_shared(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def staged_folder(out: str | os.PathLike, *, keep_existing: bool = False) -> Iterator[Path]:
    """Build a folder in a private stage beside `out`; when the block ends without an error, give it the
    permissions of an ordinary folder (`make_shared`) and rename it to `out`, so a reader finds the old
    folder or the whole new one, never half of one. A folder already at `out` is replaced only once the
    new one is complete — or, with `keep_existing`, kept and the new one dropped (another run built the
    same thing first). On an error the stage is removed and `out` is left as it was."""
    out = Path(out)
    with undone_if_refused(out.parent):  # a failed build leaves no new, empty parent folders either
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
        try:
            yield stage
            make_shared(stage)
            _swap_in(stage, out, keep_existing)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _swap_in(stage: Path, out: Path, keep_existing: bool) -> None:
    if out.exists() and not keep_existing:
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        stage.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        stage.rename(out)
    except OSError:
        if not (keep_existing and out.exists()):  # a concurrent build renamed its own into place first
            raise


def check_out_folder(out: str | os.PathLike, what: str, marker: str,
                     also_ours: Callable[[list[str]], bool] = lambda names: False) -> Path:
    """Refuse up front, creating nothing, an `--out` a command would replace but did not write: only an
    empty folder, one holding `marker` (an earlier result of the same command, `what`) or one whose file
    names `also_ours` accepts is replaced; and one that cannot be made (`check_parent_folder`)."""
    out = Path(out).expanduser()
    if out.exists():
        names = [p.name for p in out.iterdir()] if out.is_dir() else None
        if names is None or (names and marker not in names and not also_ours(names)):
            raise InputError(f"--out {str(out)!r} exists and is not {what}; choose another folder")
    return check_parent_folder(out)


def check_parent_folder(path: str | os.PathLike, what: str = "--out") -> Path:
    """Refuse up front, creating nothing, an output path below a file or in a folder that cannot be
    written: making its folders would fail only once the work it is for is done."""
    path = Path(path).expanduser()
    ancestor = next(folder for folder in path.absolute().parents if folder.exists())
    if not ancestor.is_dir():
        raise InputError(f"{what} {path} cannot be made: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path} is not writable: no write permission in {ancestor}")
    return path


def ensure_writable_dir(path: str | os.PathLike, what: str = "--out", hint: str = "") -> Path:
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


@contextmanager
def undone_if_refused(path: str | os.PathLike, files: Iterable[str | os.PathLike] = (),
                      keep: Callable[[Path], bool] | None = None) -> Iterator[None]:
    """Folders on the way to `path` that do not exist yet and that the block makes are removed again
    (while still empty) when it fails, and so are those of `files` that did not exist before it: a
    refusal found once `--out` (and its study.db) is made leaves nothing behind. A new file for which
    `keep(file)` holds at the failure stays (another process may have put its work in it since)."""
    path = Path(path).expanduser().absolute()
    missing = [folder for folder in [path, *path.parents] if not folder.exists()]  # deepest first
    new_files = [Path(file) for file in files if not os.path.lexists(file)]
    try:
        yield
    except BaseException:
        for file in new_files:
            if keep is not None and keep(file):
                continue
            try:
                file.unlink()
            except OSError:  # never made (its folder could not be)
                pass
        for folder in missing:
            try:
                folder.rmdir()
            except OSError:  # not empty, or gone: leave it and every folder above it
                break
        raise
