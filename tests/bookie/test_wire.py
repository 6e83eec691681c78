"""Entries and digests, including hostile input (the frames around them are bkwire's: test_bkwire.py)."""

from __future__ import annotations

import hashlib
import hmac
import zlib

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookfleet import wire
from bookfleet.meta import zkpaths


@given(
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(-1, 2**63 - 1),
    payload=st.binary(max_size=2048),
    digest_type=st.sampled_from(list(wire.DigestType)),
)
def test_entry_round_trip_verifies_digest(ledger_id, entry_id, payload, digest_type):
    digester = wire.Digester(digest_type, b"secret")
    encoded = wire.encode_entry(digester, ledger_id, entry_id, entry_id - 1, len(payload), payload)
    entry = wire.decode_entry(digester, encoded)
    assert (entry.ledger_id, entry.entry_id, entry.payload) == (ledger_id, entry_id, payload)
    assert wire.entry_ids(encoded) == (ledger_id, entry_id, entry_id - 1)


def test_flipped_byte_fails_the_digest():
    digester = wire.Digester("crc32c")
    encoded = bytearray(wire.encode_entry(digester, 7, 3, 2, 10, b"0123456789"))
    encoded[-1] ^= 0xFF
    with pytest.raises(wire.DigestMismatch, match="ledger 7 entry 3"):
        wire.decode_entry(digester, bytes(encoded))


def test_mac_digest_depends_on_the_password():
    encoded = wire.encode_entry(wire.Digester("mac", b"right"), 1, 0, -1, 1, b"x")
    with pytest.raises(wire.DigestMismatch):
        wire.decode_entry(wire.Digester("mac", b"wrong"), encoded)


def test_keys_and_digests_follow_bookkeepers_digest_manager():
    """The master key is SHA-1("ledger" + password); MAC is HMAC-SHA1 keyed by SHA-1("mac" + password); CRC32 is the
    32-bit CRC of header and payload as a big-endian u64; DUMMY is empty. The interop tests check them against the
    Java client itself."""
    header, payload = wire.ENTRY_HEADER.pack(7, 3, 2, 10), b"0123456789"
    assert wire.master_key(b"pw") == hashlib.sha1(b"ledgerpw").digest() and wire.MASTER_KEY_SIZE == 20
    digests = {kind: wire.Digester(kind, b"pw").digest(header, payload) for kind in wire.DigestType}
    assert digests[wire.DigestType.MAC] == hmac.new(hashlib.sha1(b"macpw").digest(), header + payload, "sha1").digest()
    assert digests[wire.DigestType.CRC32] == zlib.crc32(header + payload).to_bytes(8, "big")
    assert digests[wire.DigestType.CRC32C] == crc32c.crc32c(header + payload).to_bytes(4, "big")
    assert digests[wire.DigestType.DUMMY] == b""
    assert {len(digest) for digest in digests.values()} == {20, 8, 4, 0}
    assert all(wire.digest_size(digest_type) == len(digests[digest_type]) for digest_type in wire.DigestType)


@given(st.integers(0, 10**12))
def test_ledger_paths_round_trip(ledger_id):
    assert zkpaths.ledger_id_from_path(zkpaths.ledger(ledger_id)) == ledger_id
    assert zkpaths.ledger_id_from_marker(zkpaths.underreplicated(ledger_id)) == ledger_id


def test_ledger_path_layout_matches_bookkeeper():
    assert zkpaths.ledger(1) == "/ledgers/00/0000/L0001"
    assert zkpaths.underreplicated(1) == "/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000001"


@pytest.mark.parametrize("epoch", [-1, 2**63, 2**64 - 1])
def test_a_writer_epoch_out_of_range_is_named(epoch):
    with pytest.raises(wire.InvalidField, match=f"writer epoch {epoch} is outside \\[0, {2**63 - 1}\\]"):
        wire.check_writer_epoch(epoch)
