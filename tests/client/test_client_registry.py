"""BookieRegistry against real ZooKeeper registrations."""

from __future__ import annotations

import pytest

from bookfleet.meta import zkpaths
from bookfleet.meta.registry import BookieInfo, BookieMode, BookieRegistry, UnknownBookie


def register(zk, path: str, info: BookieInfo) -> None:
    zk.create(path, info.encode(), ephemeral=True, makepath=True)


def test_writable_and_read_only_bookies_with_addresses(zk):
    registry = BookieRegistry(zk)
    assert registry.writable() == [] and registry.all() == [] and registry.ids() == set()
    one = BookieInfo(bookie_id="b1", address="127.0.0.1:3181", zone="z1", free_bytes=10)
    two = BookieInfo(bookie_id="b2", address="127.0.0.1:3182", zone="z2")
    register(zk, zkpaths.available("b1"), one)
    register(zk, zkpaths.readonly("b2"), two)
    assert registry.writable() == [one]
    assert registry.read_only() == [two.model_copy(update={"state": BookieMode.READ_ONLY})]
    assert [info.bookie_id for info in registry.all()] == ["b1", "b2"]
    assert registry.ids() == {"b1", "b2"}  # the listings alone
    assert registry.address("b2") == "127.0.0.1:3182"
    assert registry.info("b1") == one
    with pytest.raises(UnknownBookie, match="bookie b3 is not registered"):
        registry.address("b3")


def test_malformed_registration_is_named(zk):
    zk.create(zkpaths.available("bad"), b'{"bookie_id": "bad"}', makepath=True)
    with pytest.raises(ValueError, match=r"registration of bookie bad (is not a BookieServiceInfoFormat|has no)"):
        BookieRegistry(zk).writable()
