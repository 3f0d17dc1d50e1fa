"""The engine's layers import one way (docs/architecture.md), held by reading every import statement of
``flash_pipeline`` (module level and inside functions alike):

- the catalog (``flash_pipeline.catalog``) never imports the compactor or the commands above it;
- the compactor never imports the commands above it (verify, optimize, merge_on_read, triggers, retention,
  packing, cli);
- nothing in ``flash_pipeline`` imports the Dagster layer (dagster, assets, resources, sensors);
- no two modules import each other, directly or through others (no import circles), in the engine or in the
  Dagster layer above it (``assets``, ``resources``, ``sensors``).

Imports under ``if TYPE_CHECKING:`` run only in a type checker and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "flash_pipeline"
COMMANDS = ("verify", "optimize", "merge_on_read", "triggers", "retention", "packing", "cli")
DAGSTER_LAYER = ("dagster", "assets", "resources", "sensors")


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(roots: tuple[Path, ...] = (ENGINE,)) -> dict[str, set[str]]:
    """Each module's imported modules (``from a.b import c`` counts as a.b and, if it is a module, a.b.c)."""
    modules = {_module(p): p for root in roots for p in root.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
        out[name] = found
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_catalog_and_the_compactor_import_only_downwards() -> None:
    imports = _imports()
    wrong = []
    for module, found in imports.items():
        for target in found:
            if _under(module, "flash_pipeline.catalog") and (
                    _under(target, "flash_pipeline.compactor") or any(_under(target, f"flash_pipeline.{c}") for c in COMMANDS)):
                wrong.append(f"{module} -> {target}")
            if _under(module, "flash_pipeline.compactor") and any(_under(target, f"flash_pipeline.{c}") for c in COMMANDS):
                wrong.append(f"{module} -> {target}")
            if any(_under(target, layer) for layer in DAGSTER_LAYER):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_import_circles_in_the_engine_or_the_dagster_layer() -> None:
    imports = _imports((ENGINE, *(REPO / layer for layer in DAGSTER_LAYER[1:])))
    graph = {m: {t for t in found if t in imports and t != m and not _under(m, t)} for m, found in imports.items()}
    # Tarjan's strongly connected components: a component of more than one module is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []
