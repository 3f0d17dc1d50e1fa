"""Build the kernels compiled ahead of time (kernels/aot.py) from the signatures in Numba's on-disk cache.

Run by a process that loaded Numba (aot.request_build), at the lowest priority, after that process exits:
``python -m flash_pipeline.compactor.kernels.aot_build [--after PID] [--force]``. It loads every signature Numba has
compiled on this machine (compiled.load_cached_kernels: the argument types real rounds used) and, unless the
current build already has them all, compiles them with ``numba.pycc`` into a new extension module, then points
the key's ``CURRENT`` at it (an atomic replace: a process reading the old build keeps working).

pycc cannot say two things a kernel needs, so this module sets them for the build only: the exported functions
release the GIL like ``nogil=True`` (the steps call kernels from two threads at once), and the code is generated
for this CPU's own features, like Numba's JIT (pycc's default names only a CPU model, whose implied features a
VM may not offer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flash_pipeline.compactor.kernels import aot, aot_requests
from flash_pipeline.errors import FlashError
from flash_pipeline.settings import aot_build_niceness

WAIT_SECONDS = 60  # how long a build waits for the processes that asked for it to exit
MAX_ROUNDS = 5  # builds one builder makes for requests that came while it built (more: left to the next builder)
KEEP_OLD_SECONDS = 600  # an older build another process may still be importing
OTHER_KEYS_SECONDS = 7 * 86400  # another key's builds: another installation may still use them


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--after", type=int, default=0, help="wait (at most a minute) for this process to exit")
    ap.add_argument("--force", action="store_true", help="build even when the current build has every signature")
    args = ap.parse_args(argv)
    aot.building_here()  # this process loads Numba to build: it must not ask for another build
    try:
        niceness = aot_build_niceness()  # FLASH_AOT_NICE
    except FlashError:
        niceness = 19  # a bad value: the default, the lowest priority (nobody reads a background build's errors)
    try:
        os.nice(max(0, niceness - os.nice(0)))
    except OSError:
        pass
    built = build(force=args.force, after=args.after)
    print(built if built is not None else "no build (turned off, another build running, or no CPU identity)")
    return 0


def _wait_for(pid: int, end: float) -> None:
    while time.monotonic() < end and aot.process_alive(pid):
        time.sleep(0.2)


def build(force: bool = False, after: int = 0) -> Path | None:
    """Compile every cached signature into a new build (unless the current one has them all); the build's
    directory, or None when nothing was built by this process. ``after``: the process that asked, waited for (at
    most WAIT_SECONDS) with the lock held, so that whoever sees no lock sees no build coming.

    The request is left for whoever holds the lock (kernels/aot_requests.py): this builder if it gets it, else
    the holder, which builds again for requests made while it built. A failure is recorded in the key's FAILED
    (aot.request_build asks for no build for a day after one)."""
    directory = aot.key_dir()
    if directory is None or not aot.aot_kernels_switch():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    aot_requests.leave_request(directory, after, force)
    built: Path | None = None
    failure: Exception | None = None
    rounds = 0
    for _ in range(2 * MAX_ROUNDS):  # bounded even if a request cannot be removed
        if rounds >= MAX_ROUNDS or not aot_requests.requests(directory):
            break  # looked once more after letting the lock go: nothing left
        try:
            with aot_requests.build_lock(directory) as held:
                if not held:
                    break  # the holder takes this request once its build is done
                while rounds < MAX_ROUNDS and (taken := aot_requests.take_requests(directory)):
                    rounds += 1
                    if failure is None:
                        try:
                            built = _serve(directory, taken) or built
                        except Exception as exc:  # noqa: BLE001 - recorded in FAILED; requests after it answered
                            failure = exc
        except OSError as exc:  # no lock to be had here at all (say, a file system without locks)
            _record_failure(directory, exc)
            aot_requests.take_requests(directory)
            raise
    if failure is not None:
        raise failure
    return built


def _record_failure(directory: Path, exc: BaseException) -> None:
    """FAILED: no build is asked for within a day (aot.request_build); it answers every request waiting."""
    (directory / aot.FAILED).write_text(f"{type(exc).__name__}: {exc}"[:4000])


def _serve(directory: Path, taken: list[aot_requests.Request]) -> Path | None:
    """One build for the requests ``taken`` (the lock held), after their processes exit."""
    waits = [r.waits_for for r in taken if r.waits_for > 0]
    aot_requests.note_waits(directory, waits)
    end = time.monotonic() + WAIT_SECONDS
    for pid in waits:
        _wait_for(pid, end)
    try:
        return _build_held(directory, any(r.force for r in taken))
    except Exception as exc:  # noqa: BLE001 - e.g. no C compiler: recorded, and Numba serves as before
        _record_failure(directory, exc)
        raise


def _build_held(directory: Path, force: bool) -> Path | None:
    signatures = cached_signatures()  # imports the kernel modules: the code compiled below
    imported_key = aot.compute_key()
    current = _current_table(directory)
    if current is not None and _covers(current[1], signatures) and (not force or _imports(current[0])):
        return current[0]  # forced by a process that could not import it, but it imports here: theirs to fix
    built = _compile(directory, signatures)
    if not imported_key == aot.compute_key() == directory.name:  # sources changed while this build ran
        shutil.rmtree(built, ignore_errors=True)
        return None
    _verify(built)
    _publish(directory, built)
    (directory / aot.FAILED).unlink(missing_ok=True)
    _drop_old_builds(directory, keep={built.name} | ({current[0].name} if current is not None else set()))
    return built


def cached_signatures() -> dict[str, dict[str, Any]]:
    """{kernel name: {argument types (aot.arg_key's text): Numba's typed signature}} of every kernel compiled on
    this machine, loaded from Numba's on-disk cache. Kernels inlined into their callers are left out."""
    from numba.core.registry import CPUDispatcher

    from flash_pipeline.compactor.kernels import compiled, jit, sha1, sha1_ni

    compiled.load_cached_kernels()
    dispatchers: list[tuple[str, Any]] = [(aot.kernel_name(k.__module__, k.__name__), k.compiled())
                                          for k in jit.kernels()]
    modules = [sha1] + ([sha1_ni] if sha1_ni.usable() else [])
    dispatchers += [(aot.kernel_name(m.__name__, n), v) for m in modules for n, v in vars(m).items()
                    if isinstance(v, CPUDispatcher)]
    out: dict[str, dict[str, Any]] = {}
    for name, dispatcher in dispatchers:
        if dispatcher.targetoptions.get("inline") == "always":
            continue
        for args, cres in list(dispatcher.overloads.items()):
            key = _numba_arg_key(args)
            if key is not None:
                out.setdefault(name, {})[key] = (dispatcher.py_func, cres.signature)
    return out


def _numba_arg_key(args: tuple[Any, ...]) -> str | None:
    """aot.arg_key's text for Numba's argument types (None: a type it does not write)."""
    from numba import types
    from numba.np.numpy_support import as_dtype

    parts = []
    for t in args:
        if isinstance(t, types.Array):
            if not t.aligned:
                return None  # never what numba.typeof gives a call
            parts.append(f"{as_dtype(t.dtype).str}:{t.ndim}:{t.layout}:{'w' if t.mutable else 'r'}")
        elif isinstance(t, types.Boolean):
            parts.append("|b1")
        elif isinstance(t, (types.Integer, types.Float)):
            parts.append(as_dtype(t).str)
        else:
            return None
    return ",".join(parts)


def _current_table(directory: Path) -> tuple[Path, dict[str, dict[str, str]]] | None:
    try:
        build = directory / (directory / aot.POINTER).read_text().strip()
        return build, json.loads((build / aot.TABLE).read_text())["kernels"]
    except (OSError, ValueError, KeyError):
        return None


def _covers(table: dict[str, dict[str, str]], signatures: dict[str, dict[str, Any]]) -> bool:
    return all(key in table.get(name, {}) for name, sigs in signatures.items() for key in sigs)


def _compile(directory: Path, signatures: dict[str, dict[str, Any]]) -> Path:
    """One extension module of every signature, in a new build directory, then CURRENT pointed at it."""
    from numba.pycc import CC

    name = f"flash_aot_{uuid.uuid4().hex[:12]}"
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would hide the build from the other users of a shared root
    cc = CC(name)
    cc.output_dir = str(staging)
    cc.verbose = False
    table: dict[str, dict[str, str]] = {}
    count = 0
    for kernel, sigs in sorted(signatures.items()):
        for key, (py_func, signature) in sorted(sigs.items()):
            export = f"k{count}"
            cc.export(export, signature)(py_func)
            table.setdefault(kernel, {})[key] = export
            count += 1
    with _as_nogil_for_this_cpu():
        cc.compile()
    _write_synced(staging / aot.TABLE, json.dumps({"module": name, "kernels": table}, indent=1, sort_keys=True))
    for path in staging.iterdir():
        _sync(path)
    build = directory / name
    os.replace(staging, build)
    _sync(directory)
    return build


def _verify(build: Path) -> None:
    """Import the new build and find every function its table names, in a process of its own (a damaged module
    may end the process that loads it), before any other process can see it."""
    failure = _import_failure(build)
    if failure is not None:
        shutil.rmtree(build, ignore_errors=True)
        raise RuntimeError(f"the new build does not import: {failure}")


def _imports(build: Path) -> bool:
    return _import_failure(build) is None


def _import_failure(build: Path) -> str | None:
    """Why ``build`` does not import in a fresh process (None: it does, with every function its table names)."""
    check = ("import pathlib, sys\nfrom flash_pipeline.compactor.kernels import aot\n"
             "aot.import_build(pathlib.Path(sys.argv[1]))\n")
    try:
        done = subprocess.run([sys.executable, "-c", check, str(build)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "no answer in 300 s"
    return None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-500:]}"


def _publish(directory: Path, build: Path) -> None:
    """Point the key's CURRENT at ``build`` (written, synced, then renamed over the old pointer)."""
    pointer = directory / f".{aot.POINTER}.{os.getpid()}"
    _write_synced(pointer, build.name)
    os.replace(pointer, directory / aot.POINTER)
    _sync(directory)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _as_nogil_for_this_cpu() -> Iterator[None]:
    """pycc's exported functions release the GIL and are generated for this CPU's features (see the docstring)."""
    import llvmlite.binding as llvm
    import numba.pycc.compiler as pycc_compiler
    from numba.core import codegen

    flags_class = pycc_compiler.Flags

    class NoGilFlags(flags_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    features = codegen.AOTCPUCodegen._customize_tm_features
    init = codegen.AOTCPUCodegen.__init__
    pycc_compiler.Flags = NoGilFlags  # type: ignore[misc]
    codegen.AOTCPUCodegen._customize_tm_features = lambda self: codegen.get_host_cpu_features()  # type: ignore[method-assign]

    def host_init(self: Any, module_name: str, cpu_name: str | None = None) -> None:
        init(self, module_name, llvm.get_host_cpu_name())

    codegen.AOTCPUCodegen.__init__ = host_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        pycc_compiler.Flags = flags_class  # type: ignore[misc]
        codegen.AOTCPUCodegen._customize_tm_features = features  # type: ignore[method-assign]
        codegen.AOTCPUCodegen.__init__ = init  # type: ignore[method-assign]


def _drop_old_builds(directory: Path, keep: set[str]) -> None:
    """This key's builds other than ``keep`` (the new one and the one it replaced, which a process may be importing
    right now) older than KEEP_OLD_SECONDS, with abandoned staging directories; and other keys' directories
    (older kernel sources or versions) untouched for OTHER_KEYS_SECONDS. Nothing else under the root is touched:
    FLASH_AOT_DIR may be a directory shared with other files."""
    now = time.time()
    for entry in directory.iterdir():
        ours = entry.name.startswith(("flash_aot_", ".flash_aot_"))
        if ours and entry.is_dir() and entry.name not in keep and now - entry.stat().st_mtime > KEEP_OLD_SECONDS:
            shutil.rmtree(entry, ignore_errors=True)
    for other in directory.parent.iterdir():
        if (other != directory and aot.is_key_name(other.name) and other.is_dir()
                and ((other / aot.POINTER).exists() or any(other.glob(".flash_aot_*")))
                and now - _newest(other) > OTHER_KEYS_SECONDS):
            shutil.rmtree(other, ignore_errors=True)


def _newest(directory: Path) -> float:
    try:
        return max([directory.stat().st_mtime] + [e.stat().st_mtime for e in directory.iterdir()])
    except OSError:
        return time.time()


if __name__ == "__main__":
    raise SystemExit(main())
