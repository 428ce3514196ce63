"""The modules of fdp import one another without a cycle.

Every ``import`` / ``from ... import`` statement that can run counts, wherever it is (inside
a function, a method, a try): a lazy import hides a cycle from the interpreter but not from
a reader, and it breaks as soon as someone moves it to the top of the file. Only the body of
``if TYPE_CHECKING:`` is left out: it never runs, and a type checker resolves cycles among
annotations (a base class annotating a method that returns a subclass). An edge goes to
the module a statement names (``from fdp.pld import pmf`` -> ``fdp.pld.pmf``; ``from
fdp.tradeoff import convex_minimum`` -> the package ``fdp.tradeoff``); the parent packages
Python runs on the way are not edges (else every submodule would form a cycle with
``fdp/__init__.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import fdp

ROOT = Path(fdp.__file__).resolve().parent


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of the package under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that the statements of module ``name`` import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runnable_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ``from ..x import y``
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    return {m for m in found if m in modules and m != name}


def _runnable_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (its else branch runs)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        state[start] = 1
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from ..b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nfrom pkg.sub import a\nimport numpy\n"
                              "if TYPE_CHECKING:\n    import pkg\nelse:\n    import pkg.sub\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b"}, "pkg.b": {"pkg.sub.a", "pkg.sub"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:]))
    assert find_cycle({**graph, "pkg.sub.a": set()}) is None


def test_fdp_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
