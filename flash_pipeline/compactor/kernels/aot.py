"""Kernels compiled ahead of time: compiled calls in a fresh process without loading Numba.

Loading Numba costs a fresh process ~0.4 s of one core before its first kernel returns (the import, Numba's
target context, each kernel from its on-disk cache): in a fresh ``flash-compactor compact`` of a 5M-row table
that is most of what the command costs over the same compaction in a process that has the kernels loaded.
Numba's own ahead-of-time compiler (``numba.pycc``) turns the same kernel source into a CPython extension module
that imports in milliseconds. After a process has used Numba, a builder in the background
(kernels/aot_build.py) compiles every signature Numba's on-disk cache holds into one such module; later processes
call it whenever a call's argument types match a compiled signature, and go through Numba (jit.py) otherwise.
Same Python functions, typed the same way: tests/compactor/kernels/test_aot.py checks both forms agree.

The module lives under a directory keyed by everything its machine code depends on: the kernel modules' source,
the Numba, llvmlite, NumPy and Python versions, and this CPU (model and flags: it is compiled for this CPU and
would fault on one without its instructions). ``FLASH_AOT_KERNELS=off`` turns all of it off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from flash_pipeline.settings import aot_kernels_dir, aot_kernels_switch

# the modules whose kernels are compiled, and those they take constants from (their source is part of the key;
# tests/compactor/kernels/test_aot.py checks that every module of this package they import is here)
KERNEL_MODULES = ("compiled", "index_kernels", "sha1", "sha1_ni", "frames", "jit", "aot_build", "aot_requests")
POINTER = "CURRENT"  # names the newest complete build in a key's directory
TABLE = "table.json"  # {kernel name: {argument types: exported function}}
FAILED = "FAILED"  # the last build's error (no C compiler, say): no build is asked for again within a day
RETRY_FAILED_SECONDS = 86400

_lock = threading.Lock()
_loaded: tuple[ModuleType, dict[str, dict[str, str]]] | None = None
_tried = False
_build_requested = False
_broken = False  # CURRENT names a build this process could not import: the next build replaces it


def kernel_name(module: str, name: str) -> str:
    """The name a kernel's compiled signatures are filed under: its module's last part and its own name."""
    return f"{module.rsplit('.', 1)[-1]}.{name}"


# ----- where a build lives ---------------------------------------------------------------------------------------
def root() -> Path:
    """FLASH_AOT_DIR, else the kernels' own ``__pycache__`` (beside Numba's cache) where this user may write, else
    the user's cache directory."""
    chosen = aot_kernels_dir()
    if chosen:
        return Path(chosen)
    beside = Path(__file__).resolve().parent / "__pycache__" / "flash_aot"
    if _writable(beside):
        return beside
    return Path.home() / ".cache" / "flash-compactor" / "kernels"


def _writable(path: Path) -> bool:
    """Whether this user can create ``path`` or write in it (its nearest existing ancestor decides)."""
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


_key: str | None = None


def machine_key() -> str | None:
    """A digest of what the compiled code depends on (cached for the process); None where this CPU cannot be
    identified or the kernels' source is not installed (no build)."""
    global _key
    if _key is None:
        _key = compute_key()
    return _key


def compute_key() -> str | None:
    """machine_key read afresh from the sources on disk (a build checks it again once it has compiled)."""
    cpu = _cpu_identity()
    if cpu is None:
        return None
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    try:
        for name in KERNEL_MODULES:
            h.update((here / f"{name}.py").read_bytes())
    except OSError:
        return None  # an installation without sources (bytecode only): Numba's own cache has none either
    numba_target = (os.environ.get("NUMBA_CPU_NAME"), os.environ.get("NUMBA_CPU_FEATURES"))
    h.update(repr((_versions(), sys.version, sys.implementation.cache_tag, cpu, numba_target)).encode())
    return h.hexdigest()[:KEY_CHARS]


KEY_CHARS = 24


def is_key_name(name: str) -> bool:
    """Whether a directory name under root() is a key's (the only directories a build ever removes there)."""
    return len(name) == KEY_CHARS and all(c in "0123456789abcdef" for c in name)


def _versions() -> tuple[str, str, str]:
    """Numba's, llvmlite's and NumPy's versions, from their package metadata (no import of Numba)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numba"), version("llvmlite"), np.__version__
    except PackageNotFoundError:
        return "", "", np.__version__


def _cpu_identity() -> str | None:
    """This CPU's model and instruction-set flags (Linux's /proc/cpuinfo; elsewhere None: no compiled module)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    model = next((line for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return f"{model}|{flags}" if flags else None


def key_dir() -> Path | None:
    key = machine_key()
    return None if key is None else root() / key


# ----- loading and calling -----------------------------------------------------------------------------------------
def _load() -> tuple[ModuleType, dict[str, dict[str, str]]] | None:
    """The newest complete build for this key, imported once a process (None: none, or turned off)."""
    global _loaded, _tried
    if _tried:
        return _loaded
    with _lock:
        if not _tried:
            _loaded = _import_build() if aot_kernels_switch() else None
            _tried = True
    return _loaded


def _import_build() -> tuple[ModuleType, dict[str, dict[str, str]]] | None:
    global _broken
    try:
        directory = key_dir()
        if directory is None:
            return None
        build = directory / (directory / POINTER).read_text().strip()
    except OSError:
        return None  # no build yet: Numba, as before
    try:
        return import_build(build)
    except Exception:  # noqa: BLE001 - a damaged build (or one removed as we read it): Numba, and a new build
        _broken = True
        return None


def import_build(build: Path) -> tuple[ModuleType, dict[str, dict[str, str]]]:
    """The extension module of ``build`` and its table, every function the table names found in it (raises
    otherwise)."""
    table = json.loads((build / TABLE).read_text())
    name = table["module"]
    path = next(build.glob(f"{name}.*"))
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"no module in {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    kernels = table["kernels"]
    if not all(hasattr(module, export) for exports in kernels.values() for export in exports.values()):
        raise ImportError(f"{path} lacks functions its table names")
    return module, kernels


def available() -> bool:
    """Whether this process has compiled kernels without Numba (a build for this machine exists)."""
    return _load() is not None


def arg_key(args: tuple[Any, ...]) -> str | None:
    """The argument types of a call as Numba would type them (numba.typeof: dtype, dimensions, layout, read-only;
    never alignment), written as text; None for an argument kind no compiled signature takes."""
    parts = []
    for a in args:
        if isinstance(a, np.ndarray):
            flags = a.flags
            layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
            parts.append(f"{a.dtype.str}:{a.ndim}:{layout}:{'r' if not flags.writeable else 'w'}")
        elif isinstance(a, (bool, np.bool_)):
            parts.append("|b1")
        elif isinstance(a, int) and -(1 << 63) <= a < (1 << 63):
            parts.append("<i8")
        elif isinstance(a, np.integer | np.floating):
            parts.append(a.dtype.str)
        elif isinstance(a, float):
            parts.append("<f8")
        else:
            return None
    return ",".join(parts)


def function(name: str, args: tuple[Any, ...]) -> Callable[..., Any] | None:
    """The compiled function of kernel ``name`` (kernel_name) for these arguments' types, or None."""
    loaded = _load()
    if loaded is None:
        return None
    module, table = loaded
    exports = table.get(name)
    if not exports:
        return None
    key = arg_key(args)
    export = exports.get(key) if key is not None else None
    return getattr(module, export) if export is not None else None


def has(name: str) -> bool:
    """Whether the build compiled kernel ``name`` at all (for sha1_ni's: only on a CPU with the extensions)."""
    loaded = _load()
    return loaded is not None and bool(loaded[1].get(name))


def _failed_lately() -> bool:
    directory = key_dir()
    try:
        return directory is not None and time.time() - (directory / FAILED).stat().st_mtime < RETRY_FAILED_SECONDS
    except OSError:
        return False


def wait_for_build(seconds: float) -> bool:
    """Wait (at most ``seconds``) while a build for this machine is running or asked for; whether none is now.
    For measurements: a build runs at the lowest priority but still takes a core's idle time. A build waiting
    for this process to exit is not waited for; a request that no builder takes within a poll (one left by a
    builder's cap on rounds) is not either."""
    from flash_pipeline.compactor.kernels import aot_requests

    directory = key_dir()
    if directory is None:
        return True
    end = time.monotonic() + seconds
    lock = directory / aot_requests.LOCK
    unserved = False
    while True:
        asked = bool(aot_requests.requests(directory))  # before the lock: a holder takes requests, then lets go
        if not lock.exists():
            if not asked or unserved:
                return True
            unserved = True  # a builder about to take the lock, or a holder taking it again for this request
        else:
            unserved = False
            try:
                parts = lock.read_text().split()  # the builder's pid and the ones it waits for (note_waits)
            except OSError:
                parts = []  # just removed (the next look decides), or unreadable: waited for as any other
            if str(os.getpid()) in parts[1:]:
                return False
            if parts and parts[0].isdigit() and not process_alive(int(parts[0])):
                return True  # a builder killed before it removed its lock: nothing is coming
        if time.monotonic() > end:
            return False
        time.sleep(0.2)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a lock's builder, the process a build waits for)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def building_here() -> None:
    """This process is a build (aot_build.py): its own load of Numba asks for none."""
    global _build_requested
    _build_requested = True


# ----- asking for a build --------------------------------------------------------------------------------------------
def request_build() -> None:
    """This process loaded Numba: after it exits (or in a minute at most), compile what Numba's cache holds, in a
    background process at the lowest priority (kernels/aot_build.py; it does nothing when the current build
    already has every signature). Once a process."""
    global _build_requested
    if _build_requested or not aot_kernels_switch() or machine_key() is None or _failed_lately():
        return
    _build_requested = True
    directory = key_dir()
    if directory is None or not _writable(directory):
        return  # nowhere to put a build (nor to record that it failed): no builder on every load of Numba
    try:
        command = [sys.executable, "-m", "flash_pipeline.compactor.kernels.aot_build", "--after", str(os.getpid())]
        if _broken:
            command.append("--force")
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        pass  # no build: Numba as before
