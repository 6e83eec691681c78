"""`bookfleet bench NAME`: benchmarks that print one JSON object with their same-run baseline."""

from __future__ import annotations

import importlib
import pkgutil

from bookfleet import bench


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and print JSON")
    benches = parser.add_subparsers(dest="bench", required=True, metavar="NAME")
    for module in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{bench.__name__}.{module.name}")
        if hasattr(loaded, "register"):
            loaded.register(benches)
