"""Package-wide naming rules that ruff cannot check (the import contracts are import-linter's, in make test)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

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
