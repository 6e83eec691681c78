"""The embedded ZooKeeper server answers, and each test gets its own chroot."""

import pytest

from bookfleet import zkserver
from bookfleet.zkserver import four_letter_word


def test_zookeeper_server_answers(zk_server):
    assert four_letter_word(zk_server.port) == "imok"


def test_chroot_is_empty_and_writable(zk):
    assert zk.get_children("/") == []
    zk.create("/probe", b"x")
    assert zk.get("/probe")[0] == b"x"


@pytest.mark.parametrize("share", ["0/2", "1/2", "2/3"])
def test_side_by_side_processes_pick_ports_from_shares_that_never_overlap(monkeypatch, share):
    index, count = map(int, share.split("/"))
    monkeypatch.setenv(zkserver.PORT_SHARE, "0/1")
    whole = zkserver._port_range()
    monkeypatch.setenv(zkserver.PORT_SHARE, share)
    size = len(whole) // count
    allowed = range(whole.start + index * size, whole.start + (index + 1) * size)
    assert all(zkserver.free_port() in allowed for _ in range(20))
