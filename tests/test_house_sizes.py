"""The engine's sizes stay small enough to read (issue 56): no module over 400 lines, no function over 80 lines
or 8 parameters, except the signatures listed here with the reason they may not shrink."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "flash_pipeline"
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 400, 80, 8

# function (module path relative to flash_pipeline/ : name) -> why its parameters may exceed the limit
DECLARED = {
    # the public entry points: their keywords are contracts other tools call (the paper's compact() signature,
    # auto_compact's keys and policy); new options go into CompactOptions / **kwargs, never new parameters
    "compactor/job.py:compact": "the paper's compact() keywords are a public contract",
    "triggers.py:auto_compact": "the auto-compaction API's keywords are a public contract",
    # compiled kernels take their arrays one by one: a Numba nopython function cannot take a Python object
    "compactor/kernels/index_kernels.py:_repointed": "a Numba kernel's arrays",
    "compactor/kernels/index_kernels.py:_survivor_pointer": "a Numba kernel's arrays",
    "compactor/kernels/index_kernels.py:index_pointers_kernel": "a Numba kernel's arrays",
    "compactor/kernels/index_kernels.py:survivor_index_rows_kernel": "a Numba kernel's arrays",
    "compactor/kernels/index_kernels.py:prior_pointers_kernel": "a Numba kernel's arrays",
    "compactor/kernels/index_kernels.py:repoint_chunk_kernel": "a Numba kernel's arrays",
    # a kernel's NumPy form is called in its place, with the kernel's own arguments (kernels/jit.py)
    "compactor/kernels/numpy_forms.py:survivor_index_rows": "the signature of the kernel it stands in for",
    "compactor/kernels/numpy_forms.py:repoint_chunk": "the signature of the kernel it stands in for",
}


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def _measure() -> tuple[list[str], list[str], list[str], set[str]]:
    modules, long_functions, wide_functions, seen = [], [], [], set()
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        source = path.read_text(encoding="utf-8")
        if len(source.splitlines()) > MAX_MODULE_LINES:
            modules.append(f"{rel}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{rel}:{node.name}"
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}: {lines} lines")
                if _parameters(node) > MAX_PARAMETERS:
                    seen.add(name)
                    if name not in DECLARED:
                        wide_functions.append(f"{name}: {_parameters(node)} parameters")
    return modules, long_functions, wide_functions, seen


def test_no_engine_module_function_or_signature_outgrows_the_limits() -> None:
    modules, long_functions, wide_functions, seen = _measure()
    assert modules == [], f"modules over {MAX_MODULE_LINES} lines: split them by concern"
    assert long_functions == [], f"functions over {MAX_FUNCTION_LINES} lines: give their parts names"
    assert wide_functions == [], f"functions over {MAX_PARAMETERS} parameters: pass an object (see SessionHooks)"
    assert set(DECLARED) <= seen, f"declared exceptions that no longer need it: {sorted(set(DECLARED) - seen)}"


def test_no_engine_module_imports_another_modules_private_names() -> None:
    """What modules share is public and documented: ``from flash_pipeline.x import _name`` is refused (a module's
    own names and dunder imports aside)."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flash_pipeline"):
                found += [f"{path.relative_to(ENGINE)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
