"""The event loop choice: auto takes uvloop when it is installed, asyncio always works, a bad choice is named."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bookfleet import eventloop
from bookfleet.bookie.config import BookieConfig


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_runs_on_the_standard_loop():
    assert eventloop.run(_loop_type(), "asyncio").startswith("asyncio")
    assert eventloop.name("asyncio") == "asyncio"


def test_auto_runs_on_uvloop_when_it_is_installed():
    pytest.importorskip("uvloop")
    assert eventloop.run(_loop_type(), "auto").startswith("uvloop")
    assert eventloop.name("auto") == "uvloop"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails as if it were not installed
    assert eventloop.run(_loop_type(), "auto").startswith("asyncio")
    with pytest.raises(eventloop.EventLoopUnavailable, match="uvloop is not installed"):
        eventloop.run(_loop_type(), "uvloop")


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="'trio' is not one of auto, uvloop, asyncio"):
        eventloop.loop_factory("trio")


def test_a_bookie_serving_tls_runs_on_asyncio(tmp_path):
    """uvloop's server-side start_tls fails the handshake, so --tls-dir overrides the choice; plain bookies keep it."""
    plain = BookieConfig("b1", 3181, tmp_path, tmp_path, "127.0.0.1:2181", event_loop="uvloop")
    secure = BookieConfig("b2", 3182, tmp_path, tmp_path, "127.0.0.1:2181", tls_dir=tmp_path, event_loop="uvloop")
    assert (plain.loop_choice, secure.loop_choice) == ("uvloop", "asyncio")
