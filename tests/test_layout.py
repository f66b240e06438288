"""The package's layout: imports run one way, no import loops, modules of one job.

Read from the source with ``ast``, so the test sees every import that runs:
module-level and function-level, but not those under ``if TYPE_CHECKING:``
(types only, never executed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import lance_async

ROOT = Path(lance_async.__file__).parent
PACKAGE = "lance_async"

#: Lower layers never import higher ones. A module's layer is the first entry
#: whose name is a prefix of it (most specific first).
LAYERS: list[tuple[str, int]] = [
    ("lance_async.errors", 0),
    ("lance_async._faults", 0),
    ("lance_async._threads", 0),
    ("lance_async._loopthreads", 0),
    ("lance_async._loop", 0),
    ("lance_async._schema", 0),
    ("lance_async._storage", 0),
    ("lance_async._duplicates", 0),
    ("lance_async._filters", 0),
    ("lance_async._memory", 0),
    ("lance_async._metrics", 0),
    ("lance_async._args", 0),
    ("lance_async._table", 0),
    ("lance_async._enginelog", 0),
    ("lance_async._engine_errors", 0),
    ("lance_async._retry", 0),
    ("lance_async.sources", 1),
    ("lance_async.lsm", 2),
    ("lance_async.memwal", 3),
    ("lance_async.merge", 4),
    ("lance_async.dataset", 5),
    ("lance_async.feeds", 6),
    ("lance_async.cluster", 7),
    ("lance_async.web", 7),
    ("lance_async.fastapi", 7),
    ("lance_async.demo", 7),
    ("lance_async.cli", 8),
    ("lance_async.__main__", 8),
    ("lance_async", 9),  # the public API re-exports everything (lazily)
]

MAX_MODULE_LINES = 700


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(
    name: str, path: Path, known: set[str], *, type_checking: bool = False
) -> set[str]:
    """The package's modules that ``name`` imports when it runs (with
    ``type_checking``, also those imported for types only)."""
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith(PACKAGE):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in known else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    # a submodule's own packages are being imported already: not an edge
    return {m for m in found if m in known and not name.startswith(m + ".") and m != name}


def graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {
        name: runtime_imports(name, path, known, type_checking=type_checking)
        for name, path in mods.items()
    }


def layer(name: str) -> int:
    for prefix, level in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return level
    raise AssertionError(f"{name} has no layer in tests/test_layout.py")


def test_no_import_loops_at_run_time() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                loop = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import loop: " + " -> ".join(loop))
            if nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            dfs(node)


def test_imports_run_downward_even_for_types() -> None:
    wrong = [
        f"{name} (layer {layer(name)}) imports {dep} (layer {layer(dep)})"
        for name, deps in graph(type_checking=True).items()
        for dep in deps
        if layer(dep) > layer(name)
    ]
    assert not wrong, "\n".join(wrong)


def test_lower_packages_take_the_table_protocol_not_the_dataset() -> None:
    lower = ("lance_async.lsm", "lance_async.memwal", "lance_async.merge", "lance_async.sources")
    for name, deps in graph(type_checking=True).items():
        if name.startswith(lower):
            wrong = [
                d
                for d in deps
                if d == "lance_async.dataset" or d.startswith("lance_async.dataset.")
            ]
            assert not wrong, (name, wrong)


def _package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


def test_no_module_imports_a_private_name_of_another_package() -> None:
    """``from ..x.y import _helper`` across packages is a seam used by the back
    door; the ground floor's private *modules* (``_threads``...) are its API."""
    mods = modules()
    wrong = []
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(PACKAGE) or _package(target) == _package(name):
                continue
            if any(part.startswith("_") for part in target.split(".")[2:]):
                wrong.append(f"{name} imports the private module {target}")
            wrong += [
                f"{name} imports {target}.{a.name}"
                for a in node.names
                if a.name.startswith("_")
                and not a.name.startswith("__")
                and f"{target}.{a.name}" not in mods
            ]
    assert not wrong, "\n".join(wrong)


def test_modules_stay_small() -> None:
    big = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, big
