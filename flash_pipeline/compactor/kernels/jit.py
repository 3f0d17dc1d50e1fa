"""Compiled kernels that load Numba only when the work is large enough to pay for it.

Numba costs a fresh process ~0.75 s before its first kernel returns (measured on the 2-core VM: importing
Numba 0.25 s, defining the kernels 0.13 s, Numba's target context on the first call 0.35 s, then ~0.01 s per
kernel loaded from the on-disk cache) -- half of a fresh ``flash-compactor compact`` of the paper's example,
whose kernels then run for microseconds. So a kernel here is declared with :func:`njit` like a Numba one, and
until Numba is loaded a call runs the kernel's own Python source, the very function Numba compiles: one
definition holds the semantics, and tests check that both forms agree (tests/compactor/kernels). Interpreted,
a kernel costs ~20-60 us a row, so a process interprets at most :data:`INTERPRET_BUDGET_ROWS` rows of kernel
calls in all (~0.7 s, about what loading Numba costs: a rent-or-buy rule that never pays more than twice the
better choice); the call that would exceed it loads Numba, and every later call is compiled.

A kernel may also have a NumPy form (kernels/numpy_forms.py): the same semantics as whole-array operations,
~10-400 ns a row instead of the interpreted ~30 us. Until Numba is loaded a call takes that form where it exists,
charging the same budget by its own cost a row, so an incremental command (a small delta probed against a large
index) runs without loading Numba at all, while a large job still buys it.

``FLASH_KERNELS=compiled`` (or ``interpreted``: the kernels' Python source; ``numpy``: their NumPy forms where they
have one, else their source) fixes the form for the whole process; ``auto`` is the default.
"""

from __future__ import annotations

import os
import threading
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from flash_pipeline.compactor.kernels import aot
from flash_pipeline.settings import kernel_form

# Rows of kernel calls (each call's longest first dimension) a process runs interpreted before it loads Numba.
# A fresh command compacting 10,000 rows, interpreted: 1.50 s; compiled: 1.59 s (31,000 rows of kernel calls:
# ~35 us each); 1,000 rows: 0.67 vs 1.56 s (scratch measurements on the 2-core VM, medians of 3). Loading Numba
# costs about 30,000 such rows (0.65-0.75 s: the import 0.25 s, the first kernel 0.34 s, then ~0.01 s a kernel);
# 24,000 (0.72 s) keeps a large job's extra cost (uncompiled work, then Numba) under twice the better choice. It
# was 20,000 (0.6 s) until NumPy forms were charged their wall time: the 1% spread update's 5M-row walk then
# came to 0.59-0.61 s and bought Numba for its last calls.
INTERPRET_BUDGET_ROWS = 24_000
# the budget as nanoseconds of uncompiled work, what loading Numba costs (24,000 interpreted rows at ~30 us each)
INTERPRETED_ROW_NS = 30_000
BUDGET_NS = INTERPRET_BUDGET_ROWS * INTERPRETED_ROW_NS

_lock = threading.RLock()
_kernels: list["Kernel"] = []
_state = threading.local()  # .depth: > 0 while this thread runs an interpreted kernel (its callees follow)
_loaded = False
_load_lock = threading.Lock()  # one import of Numba, whichever thread asks first
_loader: threading.Thread | None = None  # the thread loading Numba for a job that announced its work (expect_work)
_charged = 0  # nanoseconds of uncompiled kernel work this process has run (estimated by each form's cost a row)
_step_threads = 0  # threads the rounds running in this process give their steps (running_on)


def use_compiled(rows: int, row_ns: int = INTERPRETED_ROW_NS, side_by_side: bool = False) -> bool:
    """Should a call on ``rows`` rows use the compiled kernels? Charges the budget (``row_ns`` a row: the
    uncompiled form's cost) when it answers no. Also the rule of digest.py's NumPy and hashlib paths.

    ``side_by_side``: a NumPy form, whose array operations release the GIL, so that the step's threads run it
    at once: it is charged the wall time it costs the step, its cost over the threads (running_on), because
    loading Numba stalls every thread of the step for its whole time. (The 1% spread update with vectors off
    probes and walks 5M index rows: ~1 s of NumPy forms on two threads, ~0.5 s, where the load it bought
    halfway stalled both threads ~0.6 s: a fresh command takes 4.74 s, 5.10 s before this and the faster
    forms, medians of 10 paired runs.)"""
    global _charged
    chosen = kernel_form()  # FLASH_KERNELS
    if chosen != "auto":
        return chosen == "compiled"
    if _loaded or _loader is not None:  # loaded, or being loaded for a large job: its calls wait for it
        return True
    cost = rows * row_ns // (max(1, min(_step_threads, os.cpu_count() or 1)) if side_by_side else 1)
    with _lock:
        if _charged + cost > BUDGET_NS:
            return True
        _charged += cost
        return False


@contextmanager
def running_on(threads: int) -> Iterator[None]:
    """A round whose steps run ``threads`` tasks at once in this process (use_compiled's ``side_by_side``:
    the rounds of a job's partitions running together share the machine's cores)."""
    global _step_threads
    with _lock:
        _step_threads += max(1, threads)
    try:
        yield
    finally:
        with _lock:
            _step_threads -= max(1, threads)


def expect_work(ns: int, warm: Callable[[], Any] | None = None) -> None:
    """A job about to run at least ``ns`` nanoseconds of uncompiled kernel work: when that alone passes the
    budget, load Numba now rather than run calls until one would pass it. (A one-row delta on a 20,000-key table
    once interpreted its index walk, 20,000 rows just inside the budget: 0.64 s, then loaded Numba anyway.)

    The load runs on a thread of its own, then ``warm`` (the job's first kernel, whose first call also builds
    Numba's compilation target: ~0.2 s), while the job's threads go on: until it ends they decode their first
    inputs (:func:`loading`) instead of leaving a core idle; their first kernel call waits for it. In a fresh
    `flash-compactor compact` of a full 5M-row table the load and that first call are ~0.45 s of one core."""
    global _loader
    if not will_load(ns) or aot.available():  # compiled ahead of time: nothing to load
        return
    with _lock:
        if _loader is None and not _loaded:
            _loader = threading.Thread(target=_load_and_warm, args=(warm,), name="flash-numba-load", daemon=True)
            _loader.start()


def will_load(ns: int) -> bool:
    """Whether a job announcing ``ns`` nanoseconds of uncompiled kernel work (expect_work) makes this process
    load Numba: for the latency planner, which charges an in-process session the load."""
    return runs_uncompiled() and _charged + ns > BUDGET_NS and not aot.available()


def runs_uncompiled() -> bool:
    """Whether this process would run a small round's kernels uncompiled (auto forms, Numba not loaded)."""
    return kernel_form() == "auto" and not _loaded and _loader is None and not aot.available()


def _load_and_warm(warm: Callable[[], Any] | None) -> None:
    try:
        load()
        if warm is not None:
            warm()
    except Exception:  # noqa: BLE001 - a head start only: the job's own first calls load what this did not
        pass


def loading() -> bool:
    """Whether Numba is being loaded for this process's job (expect_work) right now."""
    loader = _loader
    return loader is not None and loader.is_alive()


def load() -> None:
    """Import Numba: from now on every kernel call in this process takes the compiled form."""
    global _loaded
    if not _loaded:
        with _load_lock:
            if not _loaded:
                import numba  # noqa: F401 - the import is the cost this module defers

                _loaded = True
        aot.request_build()  # compile what this process uses ahead of time, for the next (aot.py)


class Kernel:
    """A function Numba compiles on demand; until then (and for small calls) its Python source runs."""

    def __init__(self, py_func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func = py_func
        self.options = options
        self.dispatcher: Any = None
        self.numpy_func: Callable[..., Any] | None = None  # its NumPy form (numpy_forms.py), if it has one
        self.numpy_row_ns = 0
        self.numpy_rows_arg: int | None = None  # the argument whose rows its NumPy form works through (None: longest)
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__doc__ = py_func.__doc__
        self.__module__ = py_func.__module__
        self.__wrapped__ = py_func
        self.aot_name = aot.kernel_name(py_func.__module__, py_func.__name__)

    def compiled(self) -> Any:
        """The Numba dispatcher (it compiles, or loads from Numba's on-disk cache, on its first call)."""
        if self.dispatcher is None:
            load()
            with _lock:
                if self.dispatcher is None:
                    _bind_module(self.py_func.__globals__)
        return self.dispatcher

    def numpy_form(self, row_ns: int, rows_arg: int | None = None
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare ``fn`` this kernel's NumPy form, costing about ``row_ns`` nanoseconds a row (numpy_forms.py)
        of argument ``rows_arg`` (None: the longest array), so that an output array the whole step shares is
        not counted as a call's work (the index walk's chunks of 250,000 rows were each charged as its
        bucket's 2.5M output rows, which bought Numba halfway through a 1% spread update)."""

        def declare(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.numpy_func, self.numpy_row_ns, self.numpy_rows_arg = fn, row_ns, rows_arg
            return fn

        return declare

    def __call__(self, *args: Any) -> Any:
        if getattr(_state, "depth", 0):
            return self.py_func(*args)  # a callee of an interpreted kernel
        if kernel_form() in ("auto", "compiled"):
            ahead = aot.function(self.aot_name, args)  # compiled ahead of time: no Numba to load (aot.py)
            if ahead is not None:
                return ahead(*args)
        if self.numpy_func is not None and kernel_form() != "interpreted":
            rows = _rows(args) if self.numpy_rows_arg is None else len(args[self.numpy_rows_arg])
            if use_compiled(rows, self.numpy_row_ns, side_by_side=True):
                return self.compiled()(*args)
            return self.numpy_func(*args)
        if use_compiled(_rows(args)):
            return self.compiled()(*args)
        _state.depth = 1
        try:
            return self.py_func(*args)
        finally:
            _state.depth = 0

    def __repr__(self) -> str:
        return f"<kernel {self.__module__}.{self.__qualname__}>"


def _bind_module(module_globals: dict[str, Any]) -> None:
    """Give every kernel of one module its dispatcher: Numba compiles a copy of each function whose globals are
    the module's with each kernel replaced by its dispatcher (the module's own globals keep the Kernels, so the
    interpreted form calls interpreted callees). Called once the module has finished importing."""
    import numba

    namespace = dict(module_globals)
    for name, value in module_globals.items():
        if not isinstance(value, Kernel):
            continue
        if value.py_func.__globals__ is not module_globals:
            namespace[name] = value.compiled()  # a kernel imported from another module
            continue
        if value.dispatcher is None:
            fn = types.FunctionType(value.py_func.__code__, namespace, value.py_func.__name__,
                                    value.py_func.__defaults__, value.py_func.__closure__)
            fn.__qualname__ = value.py_func.__qualname__
            fn.__module__ = value.py_func.__module__
            fn.__doc__ = value.py_func.__doc__
            value.dispatcher = numba.njit(**value.options)(fn)  # the same code object: Numba's cache still applies
        namespace[name] = value.dispatcher


def kernels() -> list[Kernel]:
    """Every kernel declared in this process (for warming them up)."""
    with _lock:
        return list(_kernels)


def _rows(args: tuple[Any, ...]) -> int:
    """The longest first dimension among the arrays of a call."""
    rows = 0
    for a in args:
        if isinstance(a, np.ndarray) and a.ndim and a.shape[0] > rows:
            rows = a.shape[0]
    return rows


def njit(**options: Any) -> Callable[[Callable[..., Any]], Kernel]:
    """Declare a kernel with Numba's options (``cache``, ``nogil``, ``inline``...)."""

    def declare(py_func: Callable[..., Any]) -> Kernel:
        kernel = Kernel(py_func, options)
        with _lock:
            _kernels.append(kernel)
        return kernel

    return declare
