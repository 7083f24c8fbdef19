"""The import layers of ``src/seqstore``, read from the source with :mod:`ast` (nothing is imported).

Layers, lowest first; a module may import modules of its own layer or of lower ones, never a higher one:

0. ``format``: ``seqstore.format.*`` and the leaf modules everything uses: ``seqstore.errors``,
   ``seqstore.schema``, ``seqstore._sysinfo``, ``seqstore._mainguard`` (the main-guard check of the
   loaders' and the conversions' worker processes), ``seqstore._numba_start`` (whether a kernel would wait
   for numba's start-up on another thread);
1. ``io``: ``seqstore.io.*``;
2. ``store``: ``seqstore.store.*``;
3. ``order/data``: ``seqstore.order.*``, ``seqstore.data.*``;
4. ``torch/log/interop/engines``: those four packages and ``seqstore.spark`` / ``seqstore.ray`` (the
   short import paths of the two engines) and ``seqstore.grain`` (the Grain adapters);
5. ``cli``: the package ``seqstore`` itself (its ``__init__`` gathers the public names), ``seqstore.cli``,
   ``seqstore.demo``.

A subpackage's ``__init__`` is in its subpackage's layer. A module or subpackage added to ``seqstore`` must
be given a layer in :data:`LAYERS` (the test names any that has none).

Every import statement counts, wherever it is: module level, inside a function, and under
``if TYPE_CHECKING:`` (no exemption). Relative imports are resolved against the importing module's package.
``from X import a, b`` is an edge to ``X.a`` where that is a module and to ``X`` for a name that is not, and
also to ``X`` itself (its ``__init__`` runs first) unless ``X`` is a package the importing module lives in.
Imports of other distributions are ignored.

The checks fail on

(a) an import circle: a strongly connected group of more than one module; the edges between a package's
    ``__init__`` and the modules inside that package (either way) are left out of this check, since
    Python runs the enclosing ``__init__`` first in any case;
(b) a module over :data:`MAX_LINES` lines;
(c) an edge from a module to one of a higher layer (here every edge counts: ``from .. import name``
    inside ``seqstore.io`` reads a name of the top-level package, in the top layer).

Each failure message lists the modules and the offending edges (``importer -> imported  (file:line)``).
The checker is itself tested on small synthetic packages under ``tmp_path``.

Run: ``.venv/bin/python -m pytest -q -p no:randomly tests/test_layers.py`` (``make lint`` runs it too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "seqstore"
MAX_LINES = 700

# Layer of each module, by the longest matching prefix of its dotted name below the package (the empty
# prefix is the package's own __init__).
LAYERS: dict[str, int] = {
    "format": 0,
    "errors": 0,
    "schema": 0,
    "_sysinfo": 0,
    "_mainguard": 0,
    "_numba_start": 0,
    "io": 1,
    "store": 2,
    "order": 3,
    "data": 3,
    "torch": 4,
    "log": 4,
    "interop": 4,
    "engines": 4,
    "spark": 4,
    "ray": 4,
    "grain": 4,
    "": 5,
    "cli": 5,
    "demo": 5,
}
LAYER_NAMES = ["format", "io", "store", "order/data", "torch/log/interop/engines", "cli"]


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported}  ({self.path}:{self.line})"


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the package directory ``root`` (a package's
    ``__init__.py`` is named by the package)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _nearest(name: str, modules: Mapping[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(modules: Mapping[str, Path]) -> list[Edge]:
    """Every import of a module of ``modules`` by another, one :class:`Edge` per (statement, target)."""
    edges: list[Edge] = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                # a name that is a module is an edge to it; any other name is read from X itself;
                # X's __init__ runs first in any case, unless it is a package ``mod`` lives in
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in node.names]
                if not _encloses(name, mod):
                    targets.append(name)
            else:
                continue
            seen: set[str] = set()
            for target in targets:
                hit = _nearest(target, modules)
                if hit is not None and hit != mod and hit not in seen:
                    seen.add(hit)
                    edges.append(Edge(mod, hit, path, node.lineno))
    return edges


def _encloses(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def circles(modules: Mapping[str, Path], edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted, ignoring the edges
    between a package's ``__init__`` and the modules inside it."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if not (_encloses(e.importer, e.imported) or _encloses(e.imported, e.importer)):
            graph[e.importer].add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, succ = work[-1]
            w = next(succ, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return sorted(out)


def layer_of(module: str, layers: Mapping[str, int] = LAYERS) -> int | None:
    """The layer of dotted ``module`` (first component is the root package), or None if unassigned."""
    parts = module.split(".")[1:]
    if not parts:
        return layers.get("")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in layers:
            return layers[key]
    return None


def check(root: Path, layers: Mapping[str, int] = LAYERS, max_lines: int = MAX_LINES) -> list[str]:
    """The problems of package ``root`` as readable paragraphs (empty: none)."""
    modules = find_modules(root)
    edges = import_edges(modules)
    problems: list[str] = []

    for group in circles(modules, edges):
        members = set(group)
        inside = sorted(
            {str(e) for e in edges if e.importer in members and e.imported in members},
        )
        problems.append(f"import circle of {len(group)} modules: {', '.join(group)}\n  " + "\n  ".join(inside))

    for mod, path in sorted(modules.items()):
        with path.open(encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > max_lines:
            problems.append(f"module over {max_lines} lines: {mod} ({n} lines, {path})")

    unplaced = sorted(m for m in modules if layer_of(m, layers) is None)
    if unplaced:
        problems.append("modules without a layer (add them to LAYERS): " + ", ".join(unplaced))
    up = []
    for e in edges:
        a, b = layer_of(e.importer, layers), layer_of(e.imported, layers)
        if a is not None and b is not None and b > a:
            up.append(f"{e}   [layer {a} imports layer {b}]")
    if up:
        problems.append("imports pointing up the layers:\n  " + "\n  ".join(sorted(up)))
    return problems


def test_seqstore_layers() -> None:
    problems = check(SRC)
    order = " -> ".join(LAYER_NAMES)
    assert not problems, f"import layers of {SRC} ({order}):\n\n" + "\n\n".join(problems)


# --- the checker on synthetic packages --------------------------------------------------------------------


def _package(root: Path, files: Mapping[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


_LAYERS = {"": 2, "low": 0, "mid": 1}


def test_checker_accepts_a_clean_package(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {
        "__init__.py": "from .mid import b\nfrom . import low\n",
        "low/__init__.py": "from .a import f\n",
        "low/a.py": "import os\nfrom . import b\n",
        "low/b.py": "def f():\n    from pkg.low import f  # the enclosing package: not a circle\n",
        "mid/__init__.py": "",
        "mid/b.py": "from ..low.a import f\nimport pkg.low.b\n",
    })
    assert check(pkg, _LAYERS) == []


def test_checker_finds_a_function_level_circle(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from .b import g\n",
        "low/b.py": "def g():\n    from .a import x\n    return x\n",
    })
    problems = check(pkg, _LAYERS)
    assert len(problems) == 1, problems
    assert "import circle of 2 modules: pkg.low.a, pkg.low.b" in problems[0]
    assert "pkg.low.a -> pkg.low.b" in problems[0] and "pkg.low.b -> pkg.low.a" in problems[0]
    assert "b.py:2" in problems[0]


def test_checker_counts_type_checking_imports(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from .b import g\n",
        "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
    })
    assert any("import circle" in p for p in check(pkg, _LAYERS))


def test_checker_finds_an_upward_import(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..mid import b\n",
        "mid/__init__.py": "",
        "mid/b.py": "",
        "mid/c.py": "from .. import low\nfrom pkg import mid\n",
    })
    problems = check(pkg, _LAYERS)
    assert len(problems) == 1, problems
    text = problems[0]
    assert text.startswith("imports pointing up the layers:")
    assert "pkg.low.a -> pkg.mid  (" in text and "pkg.low.a -> pkg.mid.b  (" in text
    assert "[layer 0 imports layer 1]" in text
    assert "pkg.mid.c" not in text


def test_checker_finds_an_import_of_the_top_package_from_below(tmp_path: Path) -> None:
    files = {"__init__.py": "VERSION = 1\n", "low/__init__.py": "", "low/a.py": "from .. import VERSION\n"}
    pkg = _package(tmp_path, files)
    problems = check(pkg, _LAYERS)
    assert len(problems) == 1 and "pkg.low.a -> pkg  (" in problems[0], problems


def test_checker_finds_long_and_unplaced_modules(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"__init__.py": "", "low/a.py": "x = 1\n" * 11, "new.py": ""})
    problems = check(pkg, _LAYERS, max_lines=10)
    assert any(p.startswith("module over 10 lines: pkg.low.a (11 lines") for p in problems), problems
    assert "modules without a layer (add them to LAYERS): pkg.new" in problems
