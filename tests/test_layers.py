"""Package-wide rules that ruff and the import contracts cannot check: class names, circles of imports between files."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import grimp

import bookfleet

PACKAGE = Path(bookfleet.__file__).parent


def test_no_class_name_is_defined_twice():
    """Two classes of one name (two `BookieError`s, say) make every import a guess about which one is meant."""
    where = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(PACKAGE.parent)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_no_two_files_import_each_other_through_any_chain():
    """A circle of imports makes its files one file in all but name: none can be read, tested or moved without the
    others, and which of them runs first decides what the others see. import-linter's contract checks packages
    against their siblings; this checks every file against every other, TYPE_CHECKING imports included."""
    graph = grimp.build_graph("bookfleet")
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert [sorted(circle) for circle in strongly_connected(imports) if len(circle) > 1] == []


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components (Tarjan's algorithm, without recursion): each set of nodes that
    reach one another, a node on no circle alone in its own."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while (member := stack.pop()) != node:
                        on_stack.discard(member)
                        component.add(member)
                    on_stack.discard(node)
                    components.append(component | {node})
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components
