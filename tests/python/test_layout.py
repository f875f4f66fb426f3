"""The Python package's layout bounds (STYLE.md, "One definition per concept";
issue 31): no module of ``python/headwater`` over 600 lines, no function over
80 lines, and no import cycle between the package's modules.

Read from the source with ``ast``, so it needs neither the compiled extension
nor JAX. A function's length is ``end_lineno - lineno + 1`` (its decorators are
not counted). The import graph has an edge for every ``import`` and
``from ... import`` anywhere in a module (top level or inside a function)
except under ``if TYPE_CHECKING:``; ``from pkg import name`` points at
``pkg.name`` when that is a module and at ``pkg`` otherwise. Importing
``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, but those implicit
edges are not counted: a package's ``__init__`` re-exporting its modules is
not a loop between rooms.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "python"
PACKAGE = SOURCE / "headwater"

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80

# Modules and functions allowed over the limits, each with the reason (a
# data table may be one). None today: keep it so, or say why one must stay.
FILE_EXCEPTIONS: dict[str, str] = {}
FUNCTION_EXCEPTIONS: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (``Class.method``)."""

    def walk(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node`` except the body of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _import_nodes(ast.Module(body=[sub], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                for alias in node.names
            ]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _loop(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest loop through the first of ``members`` (one component),
    found breadth-first, as a path that returns to its start."""
    start, inside = members[0], set(members)
    parent: dict[str, str] = {}
    frontier = [start]
    while start not in parent:
        reached = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w not in parent:
                    parent[w] = v
                    reached.append(w)
        frontier = reached
    path = [start]
    while parent[path[-1]] != start:
        path.append(parent[path[-1]])
    return [start, *reversed(path[1:]), start]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop per strongly connected component of more than one module."""
    return [_loop(graph, members) for members in _components(graph)]


def test_no_module_over_600_lines() -> None:
    over = []
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES and name not in FILE_EXCEPTIONS:
            over.append(f"{_rel(path)}: {lines} lines")
    assert not over, f"modules over {MAX_FILE_LINES} lines (split them at a seam):\n" + "\n".join(
        over
    )


def test_no_function_over_80_lines() -> None:
    over = []
    for name, path in _modules().items():
        for qualname, node in _functions(ast.parse(path.read_text())):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and f"{name}.{qualname}" not in FUNCTION_EXCEPTIONS:
                over.append(f"{_rel(path)}:{node.lineno} {qualname}: {lines} lines")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles between headwater modules (arrows must point down):\n" + (
        "\n".join(" -> ".join(c) for c in cycles)
    )


def test_the_cycle_finder_finds_a_loop_and_none_in_a_tree() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    two = {"x": {"y"}, "y": {"z", "x"}, "z": {"x"}, "p": {"q"}, "q": {"p", "x"}}
    assert _cycles(two) == [["x", "y", "x"], ["p", "q", "p"]]
