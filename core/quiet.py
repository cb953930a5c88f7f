"""Quiet cores while latency is timed, on a host where training and measurements share cores.

A latency measurement holds the host's latency lock (exclusive) for as long as it runs — so two
measurements on one host never overlap — and training on the same host calls
`wait_while_measuring()` between steps and waits there while the lock is held.
Without this, a second search worker training on the cores a measurement is pinned to makes the
measured shape look slower by however busy that worker is, and over-budget verdicts turn random.

Training waits only where it could disturb a measurement: when `kdnas search --workers` kept
cores free of training (`KDNAS_LATENCY_CORES`) and this process may not run on them, it never
waits. The lock is an advisory `flock` on one file in the system's temporary folder: the kernel
drops it when its holder dies, so a killed measurer never leaves training stuck.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no host-wide coordination, measurements and training overlap
    fcntl = None

LATENCY_CORES_ENV = "KDNAS_LATENCY_CORES"  # set by `kdnas search --workers`: cores kept free of training


def _open_lock(path: Path) -> int | None:
    """A descriptor on the lock file `path`, created if need be (read-only, so a file another user
    created serves too), or None where there is no flock or the file cannot be opened: then nothing is
    coordinated, rather than a measurement or a training run failing for it."""
    if fcntl is None:
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        return None


def _latency_lock() -> Path:
    return Path(tempfile.gettempdir()) / "kdnas-latency.lock"


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Held while the block runs: an exclusive advisory flock on `path`, so processes on this host that
    ask for the same file take turns; the kernel drops it when its holder dies. Where there is no
    flock or the file cannot be opened the block runs unguarded."""
    fd = _open_lock(path)
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def quiet_host() -> Iterator[None]:
    """Held around a timed measurement: other measurements on this host wait for it, and training
    that shares its cores waits at its next step until it ends (a step already running finishes
    first, while the measuring process starts and builds its model)."""
    with exclusive(_latency_lock()):
        yield


def reserved_latency_cores() -> list[int] | None:
    """The cores `kdnas search --workers` kept free of training for measurements, if it did."""
    reserved = os.environ.get(LATENCY_CORES_ENV)
    return [int(c) for c in reserved.split(",")] if reserved else None


def shares_latency_cores() -> bool:
    """Whether this process may run on the cores latency is measured on: always, unless
    `kdnas search --workers` reserved cores for measurements and kept this process off them."""
    reserved = reserved_latency_cores()
    return reserved is None or bool(set(reserved) & set(os.sched_getaffinity(0)))


def wait_while_measuring() -> None:
    """Return at once, unless a latency measurement on this host holds the lock and this process
    shares its cores: then wait until it is released. Costs an open, a flock and a close."""
    if not shares_latency_cores():
        return
    fd = _open_lock(_latency_lock())
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
