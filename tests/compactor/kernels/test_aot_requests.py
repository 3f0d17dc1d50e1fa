"""One build of the kernels at a time, and the requests it serves (kernels/aot_requests.py, aot_build.build): a
request made while another build runs is built after it, a killed builder's lock is taken by the next builder,
a failed build answers every request waiting, and nothing else under the request names stops a build. The
builds themselves are stood in for (aot_build._build_held): what is checked here is who builds when."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from flash_pipeline.compactor.kernels import aot, aot_build, aot_requests

HOLD = """
import sys, time
from pathlib import Path
from flash_pipeline.compactor.kernels import aot_requests
with aot_requests.build_lock(Path(sys.argv[1])) as held:
    print(held, flush=True)
    time.sleep(120)
"""


@pytest.fixture
def directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This machine's key directory under a private FLASH_AOT_DIR."""
    monkeypatch.setenv("FLASH_AOT_KERNELS", "on")
    monkeypatch.setenv("FLASH_AOT_DIR", str(tmp_path))
    key_dir = aot.key_dir()
    assert key_dir is not None
    key_dir.mkdir(parents=True)
    yield key_dir


GONE = 999_999_999  # above any pid_max (at most 2**22): a process that has exited, never one reused since


def _fake_builds(monkeypatch: pytest.MonkeyPatch, during: Any = None) -> list[tuple[bool, str, int]]:
    """Stand in for the build: record (forced, the lock's text, the lock's inode) per build; ``during(n)`` runs in
    build n, as another process's arrival would."""
    builds: list[tuple[bool, str, int]] = []

    def build_held(directory: Path, force: bool) -> Path:
        lock = directory / aot_requests.LOCK
        builds.append((force, lock.read_text(), lock.stat().st_ino))
        if during is not None:
            during(len(builds))
        return directory / f"flash_aot_{len(builds)}"

    monkeypatch.setattr(aot_build, "_build_held", build_held)
    return builds


def _another_builder(directory: Path, after: int, force: bool = False) -> None:
    """What another process's builder does when this one builds: its request, then the lock (held: it exits)."""
    aot_requests.leave_request(directory, after, force)
    name = f"{aot_requests.REQUEST_PREFIX}{os.getpid()}.{after}{'.force' if force else ''}"
    (directory / name).rename(directory / name.replace(f".{os.getpid()}.", ".4242."))  # as from pid 4242
    with aot_requests.build_lock(directory) as held:
        assert held is False


def test_a_request_made_while_another_build_runs_is_built_after_it_without_letting_the_lock_go(
        directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that compiled new signatures while a build ran leaves a (forced) request; the running builder
    builds again for it, waiting for that process first, and keeps the lock between the two builds (a measurement
    waiting for builds to finish must not see none running between them)."""
    other = GONE
    builds = _fake_builds(monkeypatch, lambda n: n == 1 and _another_builder(directory, other, force=True))
    assert aot_build.build() == directory / "flash_aot_2"
    me = str(os.getpid())
    assert [b[:2] for b in builds] == [(False, me), (True, f"{me} {other}")]
    assert builds[0][2] == builds[1][2], "the same lock file through both builds"
    assert not list(directory.iterdir()), "no lock and no request left"


def test_a_request_left_after_the_last_look_under_the_lock_is_built_after_letting_it_go(
        directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder that finds the lock held exits at once: the holder looks for requests once more after letting
    the lock go (here one arrives as the lock is let go: the holder takes the lock again for it)."""
    builds = _fake_builds(monkeypatch)
    take = aot_requests.take_requests
    calls: list[int] = []

    def take_then_one_arrives(d: Path) -> list[aot_requests.Request]:
        calls.append(1)
        taken = take(d)
        if len(calls) == 2:  # the holder's last look under the lock finds nothing; then a builder arrives
            _another_builder(directory, 0)
        return taken

    monkeypatch.setattr(aot_requests, "take_requests", take_then_one_arrives)
    assert aot_build.build() == directory / "flash_aot_2" and len(builds) == 2
    assert not list(directory.iterdir())


def test_a_failed_build_answers_every_request_waiting(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FAILED stops every later request for a day: a request left during the failed build must not stay behind
    (nothing would take it; a measurement or a test waiting for requests to drain would wait forever)."""
    def failing(d: Path, force: bool) -> Path:
        _another_builder(directory, GONE)
        raise RuntimeError("CompileError: no C compiler")

    monkeypatch.setattr(aot_build, "_build_held", failing)
    with pytest.raises(RuntimeError, match="no C compiler"):
        aot_build.build()
    assert sorted(p.name for p in directory.iterdir()) == [aot.FAILED]


def test_other_entries_under_the_request_names_neither_stop_nor_loop_a_build(
        directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = [directory / "build.request.junk", directory / "build.request.1.99999999999999999999",
           directory / "build.request.1.\u00b2", directory / "build.request.1.2.force.x"]
    odd[0].mkdir()
    for path in odd[1:]:
        path.write_text("")
    builds = _fake_builds(monkeypatch)
    started = time.monotonic()
    assert aot_build.build() == directory / "flash_aot_1" and len(builds) == 1
    assert time.monotonic() - started < 5
    assert sorted(directory.iterdir()) == sorted(odd), "left as they were; the lock and the request gone"


def test_a_live_builders_lock_is_not_taken_and_a_killed_builders_is(directory: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        assert (directory / aot_requests.LOCK).read_text() == str(holder.pid)
        with aot_requests.build_lock(directory) as held:
            assert held is False
    finally:
        holder.kill()
        holder.wait()
    assert (directory / aot_requests.LOCK).exists(), "a killed builder's lock file stays"
    with aot_requests.build_lock(directory) as held:
        assert held is True and (directory / aot_requests.LOCK).read_text() == str(os.getpid())
        with aot_requests.build_lock(directory) as again:
            assert again is False, "one holder at a time, within a process too"
    assert not (directory / aot_requests.LOCK).exists()


def test_a_builder_removes_only_its_own_lock_file(directory: Path) -> None:
    lock = directory / aot_requests.LOCK
    with aot_requests.build_lock(directory) as held:
        assert held is True
        other = directory / "other"
        other.write_text("12345")
        os.replace(other, lock)  # another file at the lock's name (not this builder's)
    assert lock.read_text() == "12345"


def test_a_measurement_does_not_wait_for_a_build_that_waits_for_it(directory: Path) -> None:
    """aot.wait_for_build reads the processes a builder waits for from its lock (aot_requests.note_waits)."""
    with aot_requests.build_lock(directory) as held:
        assert held is True
        aot_requests.note_waits(directory, [GONE, os.getpid()])
        started = time.monotonic()
        assert aot.wait_for_build(30) is False and time.monotonic() - started < 5
        aot_requests.note_waits(directory, [])
        assert aot.wait_for_build(0.3) is False, "a live builder is waited for (until the deadline)"


def test_a_request_left_while_a_failed_build_unwinds_is_answered_too(directory: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Between recording FAILED and letting the lock go, another builder leaves its request and exits: the failed
    builder still looks again, and takes it (FAILED answers it; no builder would come for a day)."""
    def failing(d: Path, force: bool) -> Path:
        raise RuntimeError("CompileError: no C compiler")

    record = aot_build._record_failure

    def record_then_one_arrives(d: Path, exc: BaseException) -> None:
        record(d, exc)
        _another_builder(directory, 0)

    monkeypatch.setattr(aot_build, "_build_held", failing)
    monkeypatch.setattr(aot_build, "_record_failure", record_then_one_arrives)
    with pytest.raises(RuntimeError, match="no C compiler"):
        aot_build.build()
    assert sorted(p.name for p in directory.iterdir()) == [aot.FAILED]


def test_a_file_system_without_locks_records_a_failure_and_leaves_nothing_behind(
        directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flock refused for another reason than a holder (ENOLCK: say NFS without its lock daemon) is no holder to
    rely on: the builder records FAILED (no builder is asked for again for a day) and removes its lock file."""
    import errno

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(aot_requests.fcntl, "flock", no_locks)
    builds = _fake_builds(monkeypatch)
    with pytest.raises(OSError, match="No locks available"):
        aot_build.build()
    assert builds == [] and sorted(p.name for p in directory.iterdir()) == [aot.FAILED]


def test_a_request_that_cannot_be_removed_does_not_keep_a_builder_looping(directory: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aot_requests, "take_requests", lambda d: [])  # as if its unlink failed every time
    takes: list[int] = []
    lock = aot_requests.build_lock

    def counted(d: Path) -> Any:
        takes.append(1)
        assert len(takes) <= 100, "the builder keeps taking the lock for a request it cannot remove"
        return lock(d)

    monkeypatch.setattr(aot_requests, "build_lock", counted)
    assert aot_build.build() is None
    assert 0 < len(takes) <= 2 * aot_build.MAX_ROUNDS and not (directory / aot_requests.LOCK).exists()


def test_a_lock_let_go_between_a_builders_open_and_its_flock_is_not_held(directory: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder removes its lock file and lets go right after another builder opened it: that builder's flock
    then holds a file no longer at the name, so it must open the name again (else a third builder would create a
    new file there, and two would hold the lock)."""
    import fcntl

    first = aot_requests.build_lock(directory)
    assert first.__enter__() is True
    real = fcntl.flock
    calls: list[int] = []

    def flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            first.__exit__(None, None, None)  # the holder lets go between this builder's open and its flock
        return real(fd, op)

    monkeypatch.setattr(aot_requests.fcntl, "flock", flock)
    with aot_requests.build_lock(directory) as held:
        assert held is True and len(calls) == 2, "took the lock file created again, not the removed one"
        monkeypatch.setattr(aot_requests.fcntl, "flock", real)
        with aot_requests.build_lock(directory) as third:
            assert third is False


def test_a_measurement_waits_for_a_request_the_holder_takes_the_lock_again_for(directory: Path) -> None:
    """A holder lets the lock go and takes it again for a request left meanwhile: in between there is no lock
    file, only the request; aot.wait_for_build must not take that moment for "no build coming"."""
    import threading

    aot_requests.leave_request(directory, 0, False)

    def holder_takes_it_again() -> None:
        time.sleep(0.1)
        with aot_requests.build_lock(directory) as held:
            assert held is True
            aot_requests.take_requests(directory)
            time.sleep(1.0)

    thread = threading.Thread(target=holder_takes_it_again)
    thread.start()
    started = time.monotonic()
    try:
        assert aot.wait_for_build(20) is True
        assert time.monotonic() - started >= 0.9, "returned while the build was still coming"
    finally:
        thread.join()
    aot_requests.leave_request(directory, 0, False)  # a request no builder takes: not waited for past a poll
    started = time.monotonic()
    assert aot.wait_for_build(20) is True and time.monotonic() - started < 5
