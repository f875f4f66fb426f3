"""The Python package's layout bounds (CONTRIBUTING.md, "Layout
rules"): no module of ``python/headwater`` over 600 lines, no function over
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
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _import_nodes(
    node: ast.AST, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node`` except the body of ``if TYPE_CHECKING:``
    (included when ``type_checking``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test) and not type_checking:
            for sub in child.orelse:
                yield from _import_nodes(ast.Module(body=[sub], type_ignores=[]))
        else:
            yield from _import_nodes(child, type_checking)


def _imports(
    name: str, path: Path, modules: dict[str, Path], type_checking: bool = False
) -> set[str]:
    """The package modules that module ``name`` imports (``type_checking``:
    the imports made for type annotations only too)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), type_checking):
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


#: What cites a document that is not in the repository: design documents,
#: their sections, issue numbers, the workspace beside the checkout. Written
#: with character classes and escapes so this file does not cite them itself
#: and needs no exemption from its own check.
_OUTSIDE = re.compile(
    r"ST[Y]LE\.md|SP[E]C\.md|SP[E]C \u00a7|seed[- ]0\d\d|\u00a7|\bissues? #?\d+\b|\.\./sh[a]red"
)
_TEXT = {".rs", ".py", ".pyi", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt"}


def _outside_refs(root: Path) -> list[str]:
    out = []
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    for rel in tracked.stdout.split():
        path = root / rel
        if path.suffix not in _TEXT or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _OUTSIDE.search(line):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


def test_no_reference_to_a_document_outside_the_repository() -> None:
    """A reader can open everything the repository cites."""
    assert _outside_refs(ROOT) == []


def test_the_outside_reference_finder_finds_one(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    cited = "# see " + "issue" + " 42 and seed 0" + "00 \u00a73"
    (tmp_path / "a.py").write_text(cited + "\nx = 1\n")
    (tmp_path / "b.md").write_text("All here.\n")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert _outside_refs(tmp_path) == [f"a.py:1: {cited}"]


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles between headwater modules (arrows must point down):\n" + (
        "\n".join(" -> ".join(c) for c in cycles)
    )


# Rooms of the package a room must never import (CONTRIBUTING.md, "Arrows
# point down"), annotations included: the model (the network) knows nothing
# of the processes it runs in (cluster), of a run's config (runconfig), of
# its state on disk (rundir), of scoring it (evaluation) or of the run
# (train) that trains it; the cluster nothing of the model or of any of
# those. The config reads the model's and the cluster's sections and knows
# nothing of checkpoints, scoring or the run; the run directory (launch
# record, checkpoints, resume) holds the parameters as opaque pytrees and
# knows nothing of the model, the cluster, scoring or the run. Evaluation
# (passes, metrics, `headwater eval`) uses all four and knows nothing of
# the run, which uses it for its passes; the command line, bench and diag
# sit above the run.
_ABOVE_TRAIN = {"headwater.train", "headwater.bench", "headwater.diag", "headwater.cli"}
_ABOVE_EVALUATION = {"headwater.evaluation", *_ABOVE_TRAIN}
#: A run's config and its state on disk: what the model and the cluster never see.
_RUN = {"headwater.runconfig", "headwater.rundir"}
PY_FORBIDDEN: dict[str, set[str]] = {
    "headwater.model": {"headwater.cluster", *_RUN, *_ABOVE_EVALUATION},
    "headwater.cluster": {"headwater.model", *_RUN, *_ABOVE_EVALUATION},
    "headwater.runconfig": {"headwater.rundir", *_ABOVE_EVALUATION},
    "headwater.rundir": {"headwater.model", "headwater.cluster", *_ABOVE_EVALUATION},
    "headwater.evaluation": {*_ABOVE_TRAIN},
}


def _in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def _wrong_arrows(graph: dict[str, set[str]], forbidden: dict[str, set[str]]) -> list[str]:
    """Every edge ``a -> b`` of ``graph`` from a room to a room it must not reach."""
    return sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        for room, banned in forbidden.items()
        if _in_room(a, room) and any(_in_room(b, x) for x in banned)
    )


def test_python_arrows_point_down() -> None:
    modules = _modules()
    rooms = {m for m in modules if m in PY_FORBIDDEN}
    assert rooms == set(PY_FORBIDDEN), f"rooms of PY_FORBIDDEN not in the package: {rooms}"
    graph = {
        name: _imports(name, path, modules, type_checking=True) for name, path in modules.items()
    }
    wrong = _wrong_arrows(graph, PY_FORBIDDEN)
    assert not wrong, "a Python room imports a room above it:\n" + "\n".join(wrong)


def test_the_arrow_finder_finds_one_up() -> None:
    graph = {
        "headwater.model.transformer": {"headwater.model.optim", "headwater.train.rank"},
        "headwater.modelling": {"headwater.train"},
        "headwater.train.loop": {"headwater.model.transformer"},
    }
    rules = {"headwater.model": {"headwater.train"}}
    assert _wrong_arrows(graph, rules) == ["headwater.model.transformer -> headwater.train.rank"]


def test_the_cycle_finder_finds_a_loop_and_none_in_a_tree() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    two = {"x": {"y"}, "y": {"z", "x"}, "z": {"x"}, "p": {"q"}, "q": {"p", "x"}}
    assert _cycles(two) == [["x", "y", "x"], ["p", "q", "p"]]


# The Rust sources: the same no-loop rule over each crate's `src/`, one node
# per file. Between crates the arrows are the crate graph's (a use of a
# floor above is a compile error; `test_the_crate_graph_is_the_documented_floors`
# pins it to ARCHITECTURE.md's table).
RUST_SOURCES = [ROOT / "src", *sorted(p / "src" for p in (ROOT / "crates").iterdir())]
RUST_SOURCE = ROOT / "src"
# Inside the core crate (`src/`), rooms a room must never reach
# (CONTRIBUTING.md, "Arrows point down"). `_SAMPLING` is the rooms that make
# and deliver batches, all above the seeds and the config.
_SAMPLING = {"batch", "context", "ranking", "stream", "databases", "maker", "sampler", "bench"}
RUST_FORBIDDEN: dict[str, set[str]] = {
    # The seed and context rooms know nothing of the tensors or the maker,
    "batch": {"maker", "sampler", "bench"},
    "context": {"batch", "maker", "sampler", "bench"},
    # the rankings nothing of the context that takes their examples,
    "ranking": {"context", "batch", "maker", "sampler", "bench"},
    # the stream state nothing of the maker whose draws advance it, the
    # databases' opening and checks nothing of the plan made from them,
    "stream": {"batch", "context", "ranking", "maker", "sampler", "bench"},
    "databases": {"batch", "context", "ranking", "stream", "maker", "sampler", "bench", "seeds"},
    # the maker nothing of the `Sampler` that delivers its batches,
    "maker": {"sampler", "bench"},
    # the seeds nothing of the walks (nor of any sampling room), the config
    # nothing of the seeds either,
    "seeds": _SAMPLING,
    "config": _SAMPLING | {"seeds"},
    # the faults nothing of what they are injected into,
    "faults": _SAMPLING | {"seeds", "config"},
    # preprocessing (offline) nothing of sampling, the spill structures
    # nothing of the writer that builds on them,
    "preprocess": _SAMPLING,
    "spill": _SAMPLING | {"preprocess", "seeds", "config"},
    # and what the sampler says to the user nothing of what it is about.
    "say": _SAMPLING | {"seeds", "config", "faults", "stalls", "preprocess", "spill"},
}
_RUST_PATH = re.compile(r"\b((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
_RUST_USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M | re.S)


def _rust_modules(source: Path = RUST_SOURCE) -> dict[tuple[str, ...], Path]:
    """Every file of a crate's `source` folder by module path (`("maker",
    "draw")`; a `mod.rs` or `lib.rs` by its folder's path)."""
    out: dict[tuple[str, ...], Path] = {}
    for path in sorted(source.rglob("*.rs")):
        parts = list(path.relative_to(source).with_suffix("").parts)
        if parts[-1] in ("mod", "lib"):
            parts.pop()
        out[tuple(parts)] = path
    return out


def _rust_paths(text: str) -> Iterator[str]:
    """The `crate::…` and `super::…` paths a file names: in `use` items
    (groups expanded one level) and inline."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
    for m in _RUST_USE.finditer(text):
        body = re.sub(r"\s+", "", m.group(1))
        head, brace, rest = body.partition("{")
        if not brace:
            yield body
            continue
        for item in rest.rstrip("}").split(","):
            if item:
                yield head + item.split("{")[0]
    yield from (m.group(1) for m in _RUST_PATH.finditer(_RUST_USE.sub("", text)))


def _rust_target(
    module: tuple[str, ...], path: str, modules: dict[tuple[str, ...], Path]
) -> tuple[str, ...] | None:
    """The file a path from `module` lands in (its longest module prefix)."""
    parts = path.split("::")
    base = list(module)
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    while parts and parts[0] in ("super", "self"):
        if parts[0] == "super":
            base = base[:-1]
        parts = parts[1:]
    full = base + parts
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in modules:
            return tuple(full[:n])
    return None


def _rust_graph(source: Path = RUST_SOURCE) -> dict[str, set[str]]:
    """File → the files of the same crate it names, leaving out a module's
    edges to its own ancestors and descendants (a `mod.rs` re-exporting its
    files, or a file using its parent's items, is one room, not a loop
    between rooms)."""
    modules = _rust_modules(source)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for p in _rust_paths(path.read_text()):
            target = _rust_target(module, p, modules)
            if target is None or target == module:
                continue
            n = min(len(target), len(module))
            if target[:n] == module[:n]:
                continue
            edges.add("::".join(target) or "crate")
        graph["::".join(module) or "crate"] = edges
    return graph


def test_no_rust_use_cycles_and_arrows_point_down() -> None:
    assert len(RUST_SOURCES) >= 5, RUST_SOURCES
    for source in RUST_SOURCES:
        cycles = _cycles(_rust_graph(source))
        assert not cycles, f"use cycles between {source} files (arrows must point down):\n" + (
            "\n".join(" -> ".join(c) for c in cycles)
        )
    graph = _rust_graph()
    wrong = sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        if b.split("::")[0] in RUST_FORBIDDEN.get(a.split("::")[0], set())
    )
    assert not wrong, "a room reaches a room above it:\n" + "\n".join(wrong)


def _documented_floors() -> dict[str, set[str]]:
    """ARCHITECTURE.md's floor table: crate → the workspace crates it uses."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(headwater[\w-]*)` \| [^|]* \| ([^|]*) \|$", text, flags=re.M)
    return {name: set(re.findall(r"`(headwater[\w-]*)`", uses)) for name, uses in rows}


def test_the_crate_graph_is_the_documented_floors() -> None:
    """Each workspace crate depends on exactly the floors ARCHITECTURE.md's
    table gives it (normal dependencies; a crate may name itself for its
    tests), and every crate of the workspace is in the table."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo")
    meta = json.loads(
        subprocess.run(
            [cargo, "metadata", "--no-deps", "--format-version", "1", "--offline"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    ours = {p["name"] for p in meta["packages"]}
    real = {
        p["name"]: {
            d["name"]
            for d in p["dependencies"]
            if d["name"] in ours and d["kind"] is None and d["name"] != p["name"]
        }
        for p in meta["packages"]
    }
    floors = _documented_floors()
    assert len(floors) >= 5, floors
    assert real == floors, f"crate graph {real} != ARCHITECTURE.md's floors {floors}"


def _documented_rooms() -> dict[str, set[str]]:
    """ARCHITECTURE.md's room table: room of ``src/`` → the rooms it uses."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `src/(\w+)(?:/|\.rs)` \| ([^|]*) \|$", text, flags=re.M)
    return {name: set(re.findall(r"`(\w+)`", uses)) for name, uses in rows}


def _room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A file graph of ``src/`` folded to its rooms (``lib.rs`` left out)."""
    rooms: dict[str, set[str]] = {}
    for a, bs in graph.items():
        ra = a.split("::")[0]
        if ra == "crate":
            continue
        rooms.setdefault(ra, set()).update(
            rb for b in bs if (rb := b.split("::")[0]) not in (ra, "crate")
        )
    return rooms


def test_the_room_graph_is_the_documented_rooms() -> None:
    """Every room of the core crate uses exactly the rooms ARCHITECTURE.md's
    table gives it, and every room is in the table."""
    real, documented = _room_graph(_rust_graph()), _documented_rooms()
    assert len(documented) >= 10, documented
    diff = sorted(
        f"{room}: uses {sorted(real.get(room, set()))}, documented {sorted(documented.get(room, set()))}"
        for room in set(real) | set(documented)
        if real.get(room) != documented.get(room)
    )
    assert not diff, "ARCHITECTURE.md's room table is not the use graph:\n" + "\n".join(diff)


def test_the_room_table_check_sees_a_missing_arrow() -> None:
    real = _room_graph({"maker::draw": {"seeds::pool", "maker::plan"}, "seeds::pool": set()})
    assert real == {"maker": {"seeds"}, "seeds": set()}


def test_the_rust_use_graph_sees_groups_inline_paths_and_super() -> None:
    text = """
use crate::batch::{Batch, FxMap};
use super::draw::{BuildBuffers, Planned};
use crate::seeds::{self, Split};
fn f() { let x = crate::format::Database::open(); let y = super::plan::derive(1); }
// use crate::telemetry::Nope;
"""
    paths = set(_rust_paths(text))
    assert {"crate::batch::Batch", "super::draw::BuildBuffers", "crate::seeds::Split"} <= paths
    assert {"crate::format::Database::open", "super::plan::derive"} <= paths
    assert not any("telemetry" in p for p in paths)
    modules = _rust_modules()
    here = ("maker", "build")
    assert here in modules
    assert _rust_target(here, "super::draw::Planned", modules) == ("maker", "draw")
    assert _rust_target(here, "crate::batch::Batch", modules) == ("batch",)
    assert _rust_target(here, "crate::seeds::Split", modules) == ("seeds",)
    # A floor's path through the core's re-export lands in no room of the
    # core but its root (`lib.rs`, which re-exports it).
    assert _rust_target(here, "crate::readings::stage", modules) == ()
