"""Shared fixtures live in tests/fixtures, one plugin module per component; every module there is loaded."""

import os
import pkgutil

import pytest

from bookfleet import zkserver
from tests import fixtures

if worker := os.environ.get("PYTEST_XDIST_WORKER"):  # gw0, gw1, ...: each worker its own part of the run's share
    share, _, shares = os.environ.get(zkserver.PORT_SHARE, "0/1").partition("/")
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ[zkserver.PORT_SHARE] = f"{int(share) * workers + int(worker.removeprefix('gw'))}/{int(shares) * workers}"

pytest_plugins = [f"{fixtures.__name__}.{m.name}" for m in pkgutil.iter_modules(fixtures.__path__)]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into the node ids it schedules by
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run in parallel (`-n`), the local Kubernetes cluster is still one per session: its tests share one worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
