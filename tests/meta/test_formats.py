"""Apache BookKeeper's record formats, each encoded and read back, and the bytes a BookKeeper peer expects."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from bookfleet import wire
from bookfleet.meta import cookies, layout, zkpaths
from bookfleet.meta.formats import LedgerMetadataFormat, UnderreplicatedLedgerFormat
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataError, MetadataStore, Segment
from bookfleet.meta.registry import BookieInfo, BookieMode, BookieRegistry
from bookfleet.meta.underreplication import (
    UnderReplication,
    auditor_of_vote,
    auditor_vote,
    check_all_ledgers_ctime_of,
    check_all_ledgers_record,
    lock_holder,
    lock_record,
)


def closed_metadata() -> LedgerMetadata:
    return LedgerMetadata(
        ensemble_size=3, write_quorum=3, ack_quorum=2, state=LedgerState.CLOSED, last_entry_id=41, length=4200,
        segments=(Segment(first_entry_id=0, bookies=("b1", "b2", "b3")),
                  Segment(first_entry_id=20, bookies=("b1", "b4", "b3"))),
        digest_type=wire.DigestType.MAC, password=b"pw\x00\xff", ctime=1_700_000_000.123,
        custom={"topic": "t/0", "raw": b"\xff\xfe".decode("utf-8", "surrogateescape")}, c_token=5, writer_epoch=3,
    )


def test_ledger_metadata_round_trips_through_format_3():
    metadata = closed_metadata()
    data = metadata.encode()
    assert data.startswith(b"BookieMetadataFormatVersion\t3\n")
    assert LedgerMetadata.decode(data) == metadata
    open_one = metadata.model_copy(update={"state": LedgerState.OPEN, "last_entry_id": -1, "length": 0})
    assert LedgerMetadata.decode(open_one.encode()) == open_one


def test_format_3_carries_bookkeepers_fields_and_bookfleets_extras_in_custom_metadata():
    data = closed_metadata().encode()
    body = data[len(b"BookieMetadataFormatVersion\t3\n"):]
    record = LedgerMetadataFormat.FromString(body[1:1 + body[0]] if body[0] < 128 else body[2:])
    assert (record.quorumSize, record.ackQuorumSize, record.ensembleSize) == (3, 2, 3)
    assert (record.lastEntryId, record.length, record.ctime, record.cToken) == (41, 4200, 1_700_000_000_123, 5)
    assert LedgerMetadataFormat.DigestType.Name(record.digestType) == "HMAC" and record.password == b"pw\x00\xff"
    assert LedgerMetadataFormat.State.Name(record.state) == "CLOSED"
    assert [(s.firstEntryId, list(s.ensembleMember)) for s in record.segment] == [
        (0, ["b1", "b2", "b3"]), (20, ["b1", "b4", "b3"])]
    assert {e.key: e.value for e in record.customMetadata} == {
        "topic": b"t/0", "raw": b"\xff\xfe", "bookfleet.writerEpoch": b"3"}


def test_format_2_text_as_bookkeeper_wrote_it_is_read():
    text = (
        b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 3\nlength: 0\nlastEntryId: -1\n"
        b"state: IN_RECOVERY\nsegment {\n  ensembleMember: \"127.0.0.1:3181\"\n  ensembleMember: \"b2\"\n"
        b"  ensembleMember: \"b3\"\n  firstEntryId: 0\n}\ndigestType: CRC32C\npassword: \"\"\nackQuorumSize: 2\n"
        b"ctime: 1700000000000\n"
    )
    metadata = LedgerMetadata.decode(text)
    assert metadata.state == LedgerState.IN_RECOVERY and metadata.segments[0].bookies[0] == "127.0.0.1:3181"
    assert (metadata.write_quorum, metadata.ack_quorum, metadata.ctime) == (2, 2, 1_700_000_000.0)
    assert metadata.digest_type == wire.DigestType.CRC32C and metadata.password == b""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"ensemble_size": 3}', "bookfleet's old JSON record; this bookfleet reads"),
        (b"BookieMetadataFormatVersion\t1\n2\n3\n0\n", "not BookKeeper ledger metadata of format 2 or 3"),
        (b"BookieMetadataFormatVersion\t3\n\x05\x08", "does not parse"),
        (b"BookieMetadataFormatVersion\t3\n\x02\x08\x02", "does not parse"),  # required fields missing
        (b"garbage", "not BookKeeper ledger metadata"),
    ],
)
def test_what_is_not_bookkeeper_metadata_is_named(data, message):
    with pytest.raises(MetadataError, match=f"metadata of ledger 7 .*{message}|metadata of ledger 7 {message}"):
        LedgerMetadata.decode(data, 7)


@pytest.mark.parametrize(
    ("proto_name", "digest_type"),
    [("CRC32", wire.DigestType.CRC32), ("HMAC", wire.DigestType.MAC), ("CRC32C", wire.DigestType.CRC32C),
     ("DUMMY", wire.DigestType.DUMMY)],
)
def test_every_bookkeeper_digest_type_is_read_and_written_under_bookkeepers_name(proto_name, digest_type):
    record = LedgerMetadataFormat(quorumSize=1, ensembleSize=1, length=0, state="OPEN", digestType=proto_name,
                                  password=b"pw")
    record.segment.add(firstEntryId=0, ensembleMember=["b1"])
    body = record.SerializeToString()
    metadata = LedgerMetadata.decode(b"BookieMetadataFormatVersion\t3\n" + bytes([len(body)]) + body)
    assert metadata.digest_type == digest_type
    written = LedgerMetadataFormat()
    written.ParseFromString(metadata.encode().partition(b"\n")[2][1:])
    assert LedgerMetadataFormat.DigestType.Name(written.digestType) == proto_name


def test_registration_round_trips_as_bookie_service_info():
    info = BookieInfo(bookie_id="b1", address="127.0.0.1:3181", zone="z1", free_bytes=10, tls=True, http_port=8000,
                      total_bytes=20)
    assert BookieInfo.decode("b1", info.encode()) == info
    assert BookieInfo.decode("b1", info.encode(), read_only=True).state == BookieMode.READ_ONLY
    ipv6 = BookieInfo(bookie_id="b2", address="[::1]:3181")
    assert BookieInfo.decode("b2", ipv6.encode()) == ipv6
    with pytest.raises(ValueError, match="registration of bookie b1 is not a BookieServiceInfoFormat"):
        BookieInfo.decode("b1", b'{"bookie_id": "b1"}')


def test_a_java_bookies_registration_is_read(zk):
    """What a BookKeeper bookie writes: its endpoint among others, properties of its own, no bookfleet ones."""
    from bookfleet.meta.formats import BookieServiceInfoFormat

    record = BookieServiceInfoFormat()
    record.endpoints.add(id="httpserver", host="10.0.0.5", port=8080, protocol="http")
    record.endpoints.add(id="bookie", host="10.0.0.5", port=3181, protocol="bookie-rpc", auth=["default"])
    record.properties["autorecovery.enabled"] = "true"
    zk.create(zkpaths.available("10.0.0.5:3181"), record.SerializeToString(), makepath=True)
    [info] = BookieRegistry(zk).writable()
    assert (info.bookie_id, info.address, info.zone, info.tls) == ("10.0.0.5:3181", "10.0.0.5:3181", "", False)


def test_cookie_round_trips_in_bookkeepers_text_format():
    cookie = cookies.Cookie("b1", "/data/journal", "/data/ledgers", "4f1c-cluster")
    data = cookie.encode()
    assert data.startswith(b"5\n") and b'ledgerDirs: "1\\t/data/ledgers"' in data
    assert cookies.Cookie.decode(data, "here") == cookie
    with pytest.raises(cookies.CookieMismatch, match="old JSON cookie"):
        cookies.Cookie.decode(b'{"bookieId": "b1"}', "here")
    with pytest.raises(cookies.CookieMismatch, match="not a BookKeeper cookie"):
        cookies.Cookie.decode(b"5\nbookieHost: \"b1\"\nindexDirs: \"x\"\n", "here")


def test_layout_is_created_once_and_kept(zk):
    instance = layout.initialize(zk)
    assert zk.get(zkpaths.LAYOUT)[0] == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert zk.get(zkpaths.UR_LAYOUT)[0] == (
        b'type: "BASIC"\nversion: 1\n')
    assert layout.initialize(zk) == instance == layout.instance_id(zk)
    assert zk.exists(zkpaths.READONLY)


def test_a_fleet_of_an_earlier_bookfleet_is_refused_in_one_line(zk):
    zk.create(zkpaths.cookie("b1"), b'{"bookieId": "b1"}', makepath=True)
    with pytest.raises(layout.LayoutError, match=r"old JSON records; .*start it on a new ZooKeeper"):
        layout.initialize(zk)
    assert not zk.exists(zkpaths.LAYOUT)


def test_another_ledger_manager_is_refused(zk):
    zk.create(zkpaths.LAYOUT, b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", makepath=True)
    with pytest.raises(layout.LayoutError, match="FlatLedgerManagerFactory"):
        layout.initialize(zk)


def test_metadata_of_every_id_width_is_stored_where_bookkeeper_looks(zk):
    store = MetadataStore(zk)
    for ledger_id in (0, 2**31 - 2, 2**31 - 1, 2**63 - 1):
        store.create(closed_metadata(), ledger_id=ledger_id)
        assert zkpaths.ledger_id_from_path(zkpaths.ledger(ledger_id)) == ledger_id
        assert store.read(ledger_id)[0] == closed_metadata()
    assert zkpaths.ledger(2**63 - 1) == "/ledgers/922/3372/0368/5477/L5807"


def test_markers_are_bookkeepers_text_and_their_reasons_live_beside_them(zk):
    ur = UnderReplication(zk)
    ur.mark(7, ["b1"], lost=True)
    marker = ur.mark(7, ["b2"], missed_entries=True)
    data = zk.get("/ledgers/underreplication/ledgers/0000/0000/0000/0007/urL0000000007")[0]
    record = text_format.Parse(data.decode(), UnderreplicatedLedgerFormat())
    assert list(record.replica) == ["b1", "b2"] and record.ctime == marker.ctime
    assert (marker.lost_bookies, marker.missed_entries) == ({"b1"}, {"b2"}) and marker.missed_at
    assert ur.marker(7) == marker
    assert ur.clear(marker) and not zk.exists(zkpaths.marker_reasons(7)) and ur.marker(7) is None


def test_a_marker_bookkeeper_wrote_is_read_and_stale_reasons_are_not_taken_for_its_own(zk):
    ur = UnderReplication(zk)
    ur.mark(9, ["b1"], lost=True)
    zk.delete(zkpaths.underreplicated(9))  # BookKeeper's replication worker clears only the marker
    zk.create(zkpaths.underreplicated(9), b'replica: "b3"\n', makepath=True)  # and its auditor marks anew
    marker = ur.marker(9)
    assert (marker.missing_bookies, marker.lost_bookies, marker.ctime) == ({"b3"}, frozenset(), 0)
    assert ur.mark(9, ["b4"]).missing_bookies == {"b3", "b4"} and not zk.exists(zkpaths.marker_reasons(9))


def test_locks_and_auditor_votes_are_bookkeepers_text():
    assert lock_record("repair-1") == b'bookieId: "repair-1"\n' and lock_holder(lock_record("repair-1")) == "repair-1"
    assert auditor_of_vote(auditor_vote("10.0.0.1:3181")) == "10.0.0.1:3181"
    assert auditor_vote("a") == b'bookieId: "a"\n'


def test_the_last_full_check_is_bookkeepers_binary_record_where_its_auditor_keeps_it(zk):
    """The bytes are those BookKeeper 4.17.2's CheckAllLedgersFormat.toByteArray() gives for 1700000000123 ms: its
    setCheckAllLedgersCTime writes protobuf binary here, not the text of the markers."""
    java_bytes = bytes.fromhex("08fbd095ffbc31")
    assert check_all_ledgers_record(1_700_000_000_123) == java_bytes
    assert check_all_ledgers_ctime_of(java_bytes) == 1_700_000_000_123
    assert check_all_ledgers_ctime_of(b"") is None  # a record without the field: BookKeeper's -1, never checked
    with pytest.raises(ValueError, match="checkallledgersctime is not a CheckAllLedgersFormat"):
        check_all_ledgers_ctime_of(b"checkAllLedgersCTime: 1700000000123")
    ur = UnderReplication(zk)
    assert ur.check_all_ledgers_ctime() is None
    ur.set_check_all_ledgers_ctime(1_700_000_000_123)
    assert zk.get("/ledgers/underreplication/checkallledgersctime")[0] == java_bytes
    ur.set_check_all_ledgers_ctime(1_700_000_000_124)
    assert ur.check_all_ledgers_ctime() == 1_700_000_000_124
