"""Shared fixtures live in tests/fixtures, one plugin module per component; every module there is loaded."""

import os
import pkgutil

import pytest

from bookfleet import zkserver
from tests import fixtures

if worker := os.environ.get("PYTEST_XDIST_WORKER"):  # gw0, gw1, ...: each worker its own share of ports
    os.environ[zkserver.PORT_SHARE] = f"{worker.removeprefix('gw')}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"

pytest_plugins = [f"{fixtures.__name__}.{m.name}" for m in pkgutil.iter_modules(fixtures.__path__)]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into the node ids it schedules by
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run in parallel (`-n`), the local Kubernetes cluster is still one per session: its tests share one worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
