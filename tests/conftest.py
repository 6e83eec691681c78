"""Shared fixtures live in tests/fixtures, one plugin module per component; every module there is loaded."""

import pkgutil

from tests import fixtures

pytest_plugins = [f"{fixtures.__name__}.{m.name}" for m in pkgutil.iter_modules(fixtures.__path__)]
