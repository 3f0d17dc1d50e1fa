"""Kernels compiled ahead of time (kernels/aot.py, aot_build.py): a process that used Numba has a build made for the
next one in the background; that one compacts alike without loading Numba; the compiled functions agree with the
kernels' Python source on random inputs; and a call is matched to a compiled signature exactly as Numba types it."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline.compactor.kernels import aot, aot_build, aot_requests
from flash_pipeline.compactor.kernels.sha1_choice import sha1_rows_hashlib as sha1_choice_hashlib
from test_jit import COMMAND, _python

# what a process that used Numba runs (FLASH_KERNELS=compiled): the paper's example as a command, then the kernels
# the random checks below call, on the argument types a round gives them
WORKLOAD = """
import numpy as np
from flash_pipeline.compactor.kernels import compiled, digest
compiled.dedupe_kernel(np.zeros((3, 20), np.uint8), np.zeros((3, 4), np.uint8), np.zeros(3, np.bool_))
compiled.member_kernel(np.zeros((3, 20), np.uint8), np.zeros((5, 20), np.uint8))
digest.sha1_rows(np.zeros(10, np.uint8), np.array([0, 4, 10], np.int64))
digest.hash_buckets(np.zeros((3, 20), np.uint8), 3)
print("ok")
"""
BUILD_SECONDS = 600  # the background build: after the process exits, Numba's cache loaded and every kernel compiled


def _aot_env(directory: Path, **more: str) -> dict[str, str]:
    # a background build at normal priority: at the lowest, a build beside a busy suite on two cores may take
    # many minutes (FLASH_AOT_NICE)
    return {"FLASH_AOT_KERNELS": "on", "FLASH_AOT_DIR": str(directory), "FLASH_AOT_NICE": "0", **more}


@contextmanager
def _builds_in(directory: Path, switch: str = "on") -> Iterator[None]:
    """This process's view of the builds, read again under FLASH_AOT_DIR=``directory``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASH_AOT_KERNELS", switch)
        mp.setenv("FLASH_AOT_DIR", str(directory))
        mp.setattr(aot, "_tried", False)
        mp.setattr(aot, "_loaded", None)
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A process that used Numba (the paper's example as a command, FLASH_KERNELS=compiled), and the build it asked
    for in the background, waited for."""
    root = tmp_path_factory.mktemp("aot")
    directory = root / "builds"
    env = _aot_env(directory, FLASH_KERNELS="compiled")
    jitted = json.loads(_python(COMMAND.format(lake=str(root / "jit")), env))
    assert _python(WORKLOAD, env) == "ok"  # while the first build may still run: its request must not be lost
    deadline = time.monotonic() + BUILD_SECONDS
    done: list[Path] = []
    while time.monotonic() < deadline and not ((done := _finished(directory)) and _has_workload(done[0])):
        time.sleep(1)
    assert done, f"neither a build nor a recorded failure in {directory} {BUILD_SECONDS} s after a process used Numba"
    assert _has_workload(done[0]), "the second process's signatures should be built after the first build"
    failed = done[0].parent / aot.FAILED
    yield {"root": root, "dir": directory, "jitted": jitted, "failed": failed.read_text() if failed.exists() else None}


def _finished(directory: Path) -> list[Path]:
    """The build (CURRENT) or recorded failure once no builder runs nor any request waits: [] before."""
    done = list(directory.glob(f"*/{aot.POINTER}")) + list(directory.glob(f"*/{aot.FAILED}"))
    busy = list(directory.glob("*/build.lock")) + list(directory.glob(f"*/{aot_requests.REQUEST_PREFIX}*"))
    return [] if busy else done


def _has_workload(done: Path) -> bool:
    """A recorded failure, or a current build with the WORKLOAD's dedupe and membership signatures."""
    current = aot_build._current_table(done.parent)
    if done.name == aot.FAILED or current is None:
        return done.name == aot.FAILED
    digests = np.zeros((3, 20), np.uint8)
    wanted = {"compiled.dedupe_kernel": (digests, np.zeros((3, 4), np.uint8), np.zeros(3, np.bool_)),
              "compiled.member_kernel": (digests, np.zeros((5, 20), np.uint8))}
    return all(aot.arg_key(args) in current[1].get(name, {}) for name, args in wanted.items())


def _needs_a_build(built: dict[str, Any]) -> None:
    if built["failed"]:  # a machine without a C compiler: what the engine does there is checked in the test below
        pytest.skip(f"numba.pycc could not build here: {built['failed'][:300]}")


@pytest.mark.slow
def test_a_process_that_used_numba_leaves_a_build_the_next_compacts_with_without_loading_numba(built: dict[str, Any]) -> None:
    env = _aot_env(built["dir"], FLASH_KERNELS="compiled")
    ahead = json.loads(_python(COMMAND.format(lake=str(built["root"] / "ahead")), env))
    assert ahead["rows"] == built["jitted"]["rows"] and len(ahead["rows"]) == 8
    if built["failed"]:  # no build possible here (no C compiler): Numba as before, and no build asked for again
        assert ahead["numba"] is True
        assert not list(built["dir"].glob(f"*/{aot.POINTER}")) and not list(built["dir"].glob("*/build.lock"))
        return
    assert ahead["numba"] is False, "every compiled call should have found its signature in the build"
    build = next(built["dir"].glob(f"*/{aot.POINTER}"))
    build = build.parent / build.read_text()
    umask = os.umask(0)
    os.umask(umask)
    assert build.stat().st_mode & 0o777 == 0o777 & ~umask, "a build is as readable as the umask lets any directory be"
    off = json.loads(_python(COMMAND.format(lake=str(built["root"] / "off")), {**env, "FLASH_AOT_KERNELS": "off"}))
    assert off["numba"] is True and off["rows"] == ahead["rows"]


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), distinct=st.integers(1, 50), width=st.sampled_from([0, 4]))
def test_the_built_dedupe_and_membership_agree_with_their_python_source(
        built: dict[str, Any], seed: int, n: int, distinct: int, width: int) -> None:
    from flash_pipeline.compactor.kernels import compiled

    _needs_a_build(built)
    with _builds_in(built["dir"]):
        _dedupe_and_membership_agree(compiled, seed, n, distinct, width)


def _dedupe_and_membership_agree(compiled: Any, seed: int, n: int, distinct: int, width: int) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, distinct, n)
    digests = np.zeros((n, 20), np.uint8)
    digests[:, :8] = keys.astype(">u8").view(np.uint8).reshape(n, 8)
    digests[:, 12:20] = rng.integers(0, 256, 8, dtype=np.uint8)[None, :]  # filter bytes alike: keys still differ
    sort = rng.integers(0, 3, (n, width)).astype(np.uint8)
    is_delete = rng.random(n) < 0.2
    ahead = aot.function("compiled.dedupe_kernel", (digests, sort, is_delete))
    assert ahead is not None, "the build should have dedupe's signature (the workload compiled it)"
    got, want = ahead(digests, sort, is_delete), compiled.dedupe_kernel.py_func(digests, sort, is_delete)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    probes = np.concatenate([digests[rng.integers(0, n, 7)], rng.integers(0, 256, (5, 20), dtype=np.uint8)])
    member = aot.function("compiled.member_kernel", (digests, probes))
    assert member is not None
    assert np.array_equal(member(digests, probes), compiled.member_kernel.py_func(digests, probes))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.binary(max_size=90), min_size=1, max_size=60), buckets=st.integers(1, 1000))
def test_the_built_digests_and_buckets_agree_with_hashlib_and_big_integers(
        built: dict[str, Any], values: list[bytes], buckets: int) -> None:
    from flash_pipeline.compactor.kernels import digest, sha1_choice

    _needs_a_build(built)
    with _builds_in(built["dir"]):
        assert sha1_choice.compiled_kernels(1, 0) is sha1_choice.AHEAD_OF_TIME
        _digests_agree(digest, values, buckets)


def _digests_agree(digest: Any, values: list[bytes], buckets: int) -> None:
    buf = np.frombuffer(b"".join(values) or b"\0", np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int64)
    digests = digest.sha1_rows(buf, offsets)
    assert np.array_equal(digests, sha1_choice_hashlib(buf, offsets))
    assert digest.hash_buckets(digests, buckets).tolist() == [int.from_bytes(d.tobytes(), "big") % buckets for d in digests]


@pytest.mark.slow
def test_turned_off_a_build_is_not_used(built: dict[str, Any]) -> None:
    _needs_a_build(built)
    with _builds_in(built["dir"], switch="off"):
        assert not aot.available() and aot.function("compiled.dedupe_kernel", (np.zeros((1, 20), np.uint8),)) is None
    with _builds_in(built["dir"]):
        assert aot.available()


def _arrays() -> st.SearchStrategy[np.ndarray]:
    """Arrays as rounds hand them to kernels and odder: C, Fortran and strided layouts, read-only, unaligned."""

    @st.composite
    def draw(d: st.DrawFn) -> np.ndarray:
        dtype = np.dtype(d(st.sampled_from(["u1", "?", "<i8", "<u4", "<f8", "<i4"])))
        shape = tuple(d(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
        count = int(np.prod(shape)) if shape else 1
        if d(st.booleans()):  # unaligned: a view one byte into a buffer
            raw = np.zeros(count * dtype.itemsize + 1, np.uint8)
            a = raw[1:].view(dtype).reshape(shape)
        else:
            a = np.zeros(shape, dtype)
        form = d(st.sampled_from(["as is", "fortran", "strided"]))
        if form == "fortran" and a.ndim == 2:
            a = np.asfortranarray(a)
        elif form == "strided" and a.shape[0] > 1:
            a = a[::2]
        if d(st.booleans()):
            a.flags.writeable = False
        return a

    return draw()


@settings(max_examples=200, deadline=None)
@given(args=st.lists(st.one_of(_arrays(), st.integers(-(2**63), 2**63 - 1), st.booleans(),
                               st.floats(allow_nan=False), st.sampled_from([np.int64(3), np.uint32(7), np.float64(1.5)])),
                     min_size=1, max_size=4))
def test_a_calls_types_are_written_as_numba_types_them(args: list[Any]) -> None:
    """A build's function is chosen by the call's types (aot.arg_key, no Numba); the build filed it under Numba's
    own typing of the same values (aot_build._numba_arg_key of numba.typeof): both must write the same text."""
    import numba

    assert aot.arg_key(tuple(args)) == aot_build._numba_arg_key(tuple(numba.typeof(a) for a in args))


GONE = 999_999_999  # above any pid_max (at most 2**22): a process that has exited, never one reused since


def test_a_measurement_waits_for_a_running_build_but_not_for_one_waiting_on_itself(tmp_path: Path) -> None:
    with _builds_in(tmp_path):
        directory = aot.key_dir()
        assert directory is not None
        directory.mkdir(parents=True)
        lock = directory / "build.lock"
        assert aot.wait_for_build(0) is True  # no build
        lock.write_text(f"{os.getpid()} 0")  # a live builder (this process stands in for it)
        assert aot.wait_for_build(0.3) is False
        lock.write_text(f"{GONE} 0")  # killed before it removed its lock
        assert aot.wait_for_build(5) is True
        lock.write_text(f"{os.getppid()} {os.getpid()}")  # waits for this process to exit: never waited for
        started = time.monotonic()
        assert aot.wait_for_build(30) is False and time.monotonic() - started < 5
        lock.unlink()
        lock.mkdir()  # a lock this process cannot read: waited for until the deadline, not forever
        started = time.monotonic()
        assert aot.wait_for_build(0.5) is False and time.monotonic() - started < 5


def test_after_a_failed_build_none_is_asked_for_within_a_day(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Any] = []
    monkeypatch.setattr(aot.subprocess, "Popen", lambda *a, **k: spawned.append(a))
    with _builds_in(tmp_path):
        directory = aot.key_dir()
        assert directory is not None
        directory.mkdir(parents=True)
        (directory / aot.FAILED).write_text("CompileError: no C compiler")
        monkeypatch.setattr(aot, "_build_requested", False)
        aot.request_build()
        assert spawned == []
        os.utime(directory / aot.FAILED, (0, time.time() - aot.RETRY_FAILED_SECONDS - 60))
        aot.request_build()
        assert len(spawned) == 1 and "aot_build" in " ".join(spawned[0][0])


@pytest.mark.slow
def test_without_a_c_compiler_the_failure_is_recorded_and_numba_serves_as_before(tmp_path: Path) -> None:
    """pycc links with the platform's C compiler (CC=/bin/false stands for a machine without one): the build
    records its error, no process asks again for a day, and compactions go on through Numba."""
    env = _aot_env(tmp_path / "builds", FLASH_KERNELS="compiled", CC="/bin/false", LDSHARED="/bin/false")
    first = json.loads(_python(COMMAND.format(lake=str(tmp_path / "first")), env))
    deadline = time.monotonic() + BUILD_SECONDS
    while time.monotonic() < deadline and not list((tmp_path / "builds").glob(f"*/{aot.FAILED}")):
        time.sleep(1)
    assert list((tmp_path / "builds").glob(f"*/{aot.FAILED}")), "the failed build should have recorded its error"
    assert not list((tmp_path / "builds").glob(f"*/{aot.POINTER}"))
    second = json.loads(_python(COMMAND.format(lake=str(tmp_path / "second")), env))
    assert second["numba"] is True and second["rows"] == first["rows"] and len(first["rows"]) == 8
    time.sleep(1)
    assert not list((tmp_path / "builds").glob("*/build.lock")), "no build is asked for again after a failure"


def test_the_key_covers_every_module_the_compiled_kernels_take_code_or_constants_from() -> None:
    """A build is found by its key: a module whose code or constants the kernels compile in, left out of the key,
    would let a changed constant run old machine code."""
    import ast

    here = Path(aot.__file__).parent
    for name in aot.KERNEL_MODULES:
        tree = ast.parse((here / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flash_pipeline.compactor.kernels"):
                imported = [node.module.rsplit(".", 1)[-1]] if node.module.count(".") == 3 else [a.name for a in node.names]
                assert set(imported) <= set(aot.KERNEL_MODULES) | {"aot"}, (name, imported)


# ----- the builder's and the loader's failure paths (a review's findings) -------------------------------------------
def _fake_build(directory: Path, name: str, so_bytes: bytes = b"", table: Any = None) -> Path:
    build = directory / name
    build.mkdir(parents=True)
    (build / f"{name}.cpython-311-x86_64-linux-gnu.so").write_bytes(so_bytes)
    (build / aot.TABLE).write_text(json.dumps(table if table is not None else {"module": name, "kernels": {"compiled.x": {"": "k0"}}}))
    return build


def test_a_damaged_build_is_not_used_and_the_next_build_replaces_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Any] = []
    monkeypatch.setattr(aot.subprocess, "Popen", lambda *a, **k: spawned.append(a[0]))
    for damage in (b"", b"\x7fELF" + b"\0" * 60):
        for table in (None, [], {"module": "m"}):
            with _builds_in(tmp_path / f"d{len(spawned)}"):
                directory = aot.key_dir()
                assert directory is not None
                build = _fake_build(directory, "flash_aot_broken", damage, table)
                (directory / aot.POINTER).write_text(build.name)
                monkeypatch.setattr(aot, "_broken", False)
                monkeypatch.setattr(aot, "_build_requested", False)
                assert not aot.available() and aot.function("compiled.x", ()) is None
                aot.request_build()
                assert spawned[-1][-1] == "--force", "a build that did not import must be rebuilt, covered or not"


def test_a_new_build_that_does_not_import_is_never_published(tmp_path: Path) -> None:
    build = _fake_build(tmp_path, "flash_aot_bad", b"\x7fELF" + b"\0" * 60)
    with pytest.raises(RuntimeError, match="does not import"):
        aot_build._verify(build)
    assert not build.exists()


@pytest.mark.parametrize("keys_seen", [("other", "other"), ("other", "same"), ("same", "other")],
                         ids=["changed", "changed-and-reverted-while-importing", "changed-while-compiling"])
def test_a_build_of_sources_that_changed_while_it_ran_is_discarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   keys_seen: tuple[str, str]) -> None:
    """The key of the sources as the builder imported them and as they are once it compiled must both be the key
    it builds for: an edit reverted in between would otherwise file the edited code under the old key."""
    with _builds_in(tmp_path):
        directory = aot.key_dir()
        assert directory is not None
        directory.mkdir(parents=True)
        seen = iter([directory.name if k == "same" else "0" * aot.KEY_CHARS for k in keys_seen])
        monkeypatch.setattr(aot_build, "cached_signatures", lambda: {})
        monkeypatch.setattr(aot_build, "_compile", lambda d, s: _fake_build(d, "flash_aot_new"))
        monkeypatch.setattr(aot, "compute_key", lambda: next(seen))  # after the import, then after the compile
        assert aot_build._build_held(directory, force=True) is None
        assert not (directory / aot.POINTER).exists() and not (directory / "flash_aot_new").exists()


def test_a_forced_build_keeps_a_current_build_that_imports_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that could not import the build asks for a forced one (say it may not read another user's
    files); when the build imports for the builder, it is kept, not rebuilt on every such request."""
    with _builds_in(tmp_path):
        directory = aot.key_dir()
        assert directory is not None
        current = _fake_build(directory, "flash_aot_current")
        (directory / aot.POINTER).write_text(current.name)
        monkeypatch.setattr(aot_build, "cached_signatures", lambda: {})
        compiled: list[Any] = []
        monkeypatch.setattr(aot_build, "_compile", lambda d, s: compiled.append(d) or _fake_build(d, "flash_aot_new"))
        monkeypatch.setattr(aot_build, "_verify", lambda b: None)
        monkeypatch.setattr(aot, "compute_key", lambda: directory.name)
        monkeypatch.setattr(aot_build, "_imports", lambda b: True)
        assert aot_build._build_held(directory, force=True) == current and compiled == []
        monkeypatch.setattr(aot_build, "_imports", lambda b: False)
        assert aot_build._build_held(directory, force=True) == directory / "flash_aot_new" and len(compiled) == 1


def test_old_builds_go_but_nothing_else_under_a_shared_directory(tmp_path: Path) -> None:
    with _builds_in(tmp_path):
        directory = aot.key_dir()
        assert directory is not None
        old = time.time() - 60 * 86400
        current, previous, older = (_fake_build(directory, f"flash_aot_{n}") for n in ("new", "prev", "old"))
        other_key = tmp_path / ("a" * aot.KEY_CHARS)
        _fake_build(other_key, "flash_aot_x")
        (other_key / aot.POINTER).write_text("flash_aot_x")
        someone_else = tmp_path / "someone_elses_data" / "nested"
        someone_else.mkdir(parents=True)
        (someone_else / "file.txt").write_text("mine")
        hex_named = tmp_path / ("b" * aot.KEY_CHARS)  # a key-like name that holds no build
        hex_named.mkdir()
        for path in (previous, older, other_key, other_key / "flash_aot_x", other_key / aot.POINTER,
                     someone_else.parent, someone_else, someone_else / "file.txt", hex_named):
            os.utime(path, (old, old))
        aot_build._drop_old_builds(directory, keep={current.name, previous.name})
        assert current.exists() and previous.exists() and not older.exists() and not other_key.exists()
        assert (someone_else / "file.txt").read_text() == "mine" and hex_named.exists()


def test_no_builder_is_started_where_no_build_could_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Any] = []
    monkeypatch.setattr(aot.subprocess, "Popen", lambda *a, **k: spawned.append(a))
    (tmp_path / "a_file").write_text("")
    with _builds_in(tmp_path / "a_file" / "builds"):
        monkeypatch.setattr(aot, "_build_requested", False)
        aot.request_build()
    assert spawned == []


def test_an_installation_without_kernel_sources_has_no_key_and_runs_without_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aot, "KERNEL_MODULES", aot.KERNEL_MODULES + ("not_installed",))
    assert aot.compute_key() is None


def test_a_bad_flash_aot_kernels_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path: Path) -> None:
    from compaction_helpers import assert_compact_command_refused

    assert_compact_command_refused(tmp_path, {"FLASH_AOT_KERNELS": "maybe"}, "FLASH_AOT_KERNELS")
