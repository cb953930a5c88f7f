"""A throw-away PostgreSQL server for the tests and benchmarks: Debian's `postgresql` programs
(installed by `bash dev.sh setup`), `initdb` into a temporary folder, a Unix socket there, password
authentication (user `postgres`, password `PASSWORD`), stopped and removed on exit."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

PASSWORD = "kdnas-test"


def server_binaries() -> Path | None:
    found = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))), None)
    return Path(found).resolve().parent if found else None


def _as_server_user(argv: list[str], folder: Path) -> list[str]:
    """PostgreSQL refuses to run as root: there it runs as the `postgres` user the package creates."""
    if os.geteuid() != 0:
        return argv
    shutil.chown(folder, "postgres")
    return ["runuser", "-u", "postgres", "--", *argv]


@contextlib.contextmanager
def temporary_server() -> Iterator[str]:
    """Start a server; yields its SQLAlchemy URL (psycopg 3)."""
    bin_dir = server_binaries()
    assert bin_dir, "PostgreSQL's server programs are missing: bash dev.sh setup installs Debian's postgresql"
    # Not under pytest's tmp folder: that one is private to this user, and the server user must enter.
    root = Path(tempfile.mkdtemp(prefix="kdnas-pg-"))
    data, sockets = root / "data", root / "sock"
    data.mkdir()
    sockets.mkdir()
    os.chmod(root, 0o755)
    _as_server_user([], sockets)  # the server writes its socket there
    secret = root / "pwfile"
    secret.write_text(PASSWORD + "\n")
    os.chmod(secret, 0o644)
    initdb = [str(bin_dir / "initdb"), "-D", str(data), "-A", "scram-sha-256", "-U", "postgres", f"--pwfile={secret}"]
    subprocess.run(_as_server_user(initdb, data), check=True, capture_output=True)
    port = str(20000 + os.getpid() % 20000)
    start = [str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l", str(data / "log"),
             "-o", f"-k {sockets} -p {port} -c listen_addresses='' -c max_connections=200", "start"]
    subprocess.run(_as_server_user(start, data), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres:{PASSWORD}@/postgres?host={sockets}&port={port}"
    finally:
        subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], data),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
