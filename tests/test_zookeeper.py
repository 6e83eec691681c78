"""The embedded ZooKeeper server answers, and each test gets its own chroot."""

from bookfleet.zkserver import four_letter_word


def test_zookeeper_server_answers(zk_server):
    assert four_letter_word(zk_server.port) == "imok"


def test_chroot_is_empty_and_writable(zk):
    assert zk.get_children("/") == []
    zk.create("/probe", b"x")
    assert zk.get("/probe")[0] == b"x"
