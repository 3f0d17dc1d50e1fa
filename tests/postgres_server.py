"""A real PostgreSQL server for the tests that run Dagster on it (no test functions here).

Debian's server binaries (package ``postgresql``, installed here when missing and the tests run as root, as in
CI), a cluster in a temporary directory owned by the ``postgres`` user (the server refuses to run as root),
listening on 127.0.0.1 only, stopped at the end of the session.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from conftest import free_port, stop_process, wait_for_port


def server_bin() -> Path:
    """The newest installed PostgreSQL's bin directory, installing Debian's package first when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "postgresql"], check=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise RuntimeError("no PostgreSQL server: install Debian's package postgresql (apt-get install -y postgresql)")
    return Path(found[-1]).parent


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _create_database(bindir: Path, port: int, timeout: float = 60.0) -> None:
    """``createdb dagster``, retried while the server finishes starting: it listens before it accepts
    connections ("the database system is starting up"), and a busy machine once failed the first attempt."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(_as_postgres([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "flash",
                                            "dagster"]), capture_output=True, text=True)
        if done.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"createdb on 127.0.0.1:{port} failed for {timeout:.0f} s: {done.stderr.strip()}")
        time.sleep(0.2)


def run_server(fsync: bool = False) -> Iterator[str]:
    """Start a server in a new temporary directory (its own, not pytest's: those are private to root, and the
    server runs as ``postgres``); yield its URL (database ``dagster``, user ``flash``, no password). ``fsync``:
    durable commits, as a real deployment has them (benchmarks); the tests run without."""
    bindir = server_bin()
    root = Path(tempfile.mkdtemp(prefix="flash-postgres-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "flash", "--no-sync"]),
                   check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(
        _as_postgres([str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(root),
                      "-c", f"fsync={'on' if fsync else 'off'}", "-c", "max_connections=200"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc=proc)
        _create_database(bindir, port)
        yield f"postgresql+psycopg2://flash@127.0.0.1:{port}/dagster"  # SQLAlchemy 2.1 would pick psycopg 3
    finally:
        stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)
