"""One build of the kernels at a time, and the requests it serves (kernels/aot_build.py).

Every builder leaves a request file, ``build.request.<its pid>.<pid it waits for>[.force]``, then tries the lock;
whoever holds it takes the requests, builds, and takes any left meanwhile before letting the lock go (and once
more after: a builder that found the lock held has exited, relying on the holder). So a process that compiled
new signatures while another build ran has them built too.

The lock is ``build.lock``: an ``flock`` on it decides who holds it (the kernel drops it when its builder dies,
so no stale-lock guess, no two builders taking one dead builder's lock), and its text names the builder and the
processes it waits for, which ``aot.wait_for_build`` reads (it needs no lock of its own).
"""

from __future__ import annotations

import fcntl
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

LOCK = "build.lock"
REQUEST_PREFIX = "build.request."
_REQUEST = re.compile(r"build\.request\.(\d{1,9})\.(\d{1,9})(\.force)?", re.ASCII)


class Request(NamedTuple):
    waits_for: int  # the process that asked (0: none), its signatures complete once it exits
    force: bool  # build even if the current build has every signature (a process could not import it)


def leave_request(directory: Path, after: int, force: bool) -> None:
    """A request file per builder (named, never written to: nothing to read half-written)."""
    name = f"{REQUEST_PREFIX}{os.getpid()}.{after}{'.force' if force else ''}"
    os.close(os.open(directory / name, os.O_CREAT | os.O_WRONLY, 0o644))


def requests(directory: Path) -> list[Path]:
    """The request files waiting (anything else under the name, say a directory, is not one and is left)."""
    return sorted(p for p in directory.glob(f"{REQUEST_PREFIX}*") if _REQUEST.fullmatch(p.name) and p.is_file())


def take_requests(directory: Path) -> list[Request]:
    """Remove the requests waiting (the lock held) and return them; one another holder took first is skipped."""
    taken = []
    for path in requests(directory):
        match = _REQUEST.fullmatch(path.name)
        try:
            path.unlink()
        except OSError:
            continue
        if match is not None:
            taken.append(Request(int(match.group(2)), match.group(3) is not None))
    return taken


def note_waits(directory: Path, waits: list[int]) -> None:
    """Write the builder and the processes it waits for into its lock, in place (the flock is on this file):
    emptied first, so a reader sees this text, a part of it, or nothing (which it takes as a build running)."""
    text = " ".join(str(pid) for pid in [os.getpid(), *waits]).encode()
    fd = os.open(directory / LOCK, os.O_WRONLY)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    finally:
        os.close(fd)  # another description of the file: the builder's flock stays


@contextmanager
def build_lock(directory: Path) -> Iterator[bool]:
    """Whether this process holds ``directory``'s build lock for the block. Removed by its builder on the way out
    (a killed builder's file stays, unlocked, and the next builder takes it)."""
    lock = directory / LOCK
    fd = _take(lock)
    if fd is None:
        yield False
        return
    try:
        os.ftruncate(fd, 0)  # a killed builder's text gone before this one's is written: never a mix of the two
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield True
    finally:
        try:
            if _same_file(lock, fd):
                lock.unlink()
        except OSError:
            pass
        os.close(fd)


def _take(lock: Path) -> int | None:
    """An open, flocked descriptor of a file this call created at ``lock``, or None when a live builder holds it.

    A file left there by a builder that died (no flock on it) is removed under its flock and created again, so the
    holder can always write its own text (a shared FLASH_AOT_DIR: the dead builder may have been another user;
    read access is all a flock needs). Any other failure to lock (a file system without locks) is raised, with the
    file removed if this call created it: a build that cannot lock is recorded as failed (aot_build.build)."""
    for _ in range(4):
        try:
            fd, created = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(lock, os.O_RDONLY), False
            except FileNotFoundError:
                continue  # let go by its holder just now: create it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            if created:
                lock.unlink(missing_ok=True)
            os.close(fd)
            raise
        if created and _same_file(lock, fd):
            return fd
        if not created and _same_file(lock, fd):
            lock.unlink(missing_ok=True)  # a dead builder's file, removed while this flock keeps others off it
        os.close(fd)  # removed by its holder between the open and the flock, or just now: create a new one
    return None


def _same_file(path: Path, fd: int) -> bool:
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)
