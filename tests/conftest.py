"""Shared fixtures live in tests/fixtures as plugins, one module per component."""

pytest_plugins = ["tests.fixtures.zookeeper"]
