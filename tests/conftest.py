"""Shared fixtures live in tests/fixtures, one plugin module per component; every module there is loaded."""

import pkgutil

import pytest

from tests import fixtures

pytest_plugins = [f"{fixtures.__name__}.{m.name}" for m in pkgutil.iter_modules(fixtures.__path__)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run in parallel (`-n`), the local Kubernetes cluster is still one per session: its tests share one worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
