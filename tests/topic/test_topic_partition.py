"""A partition's ledger list in ZooKeeper (compare-and-set) and the entry payload format."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookfleet import wire
from bookfleet.topic.partition import (
    Partition,
    PartitionChanged,
    Topic,
    TopicError,
    decode_messages,
    encode_messages,
)


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20))
def test_batch_round_trip(messages):
    assert decode_messages(encode_messages(messages, batched=True)) == (True, messages)
    assert decode_messages(encode_messages(messages[:1], batched=False)) == (False, messages[:1])


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"\x00", "shorter than 5"),
        (b"\x02\x00\x00\x00\x01", "kind 2"),
        (b"\x00\x00\x00\x00\x02", "kind 0 with 2"),
        (b"\x01\x00\x00\x00\x01\x00\x00\x00\x09abc", "runs past its end"),
        (b"\x01\x00\x00\x00\x01\x00\x00\x00\x01ab", "1 byte(s) after"),
    ],
)
def test_malformed_payloads_are_named(payload, complaint):
    with pytest.raises(wire.ProtocolError, match=re.escape(complaint)):
        decode_messages(payload)


def test_ledger_list_is_compare_and_set(zk):
    partition = Partition(zk, "orders", 0)
    assert partition.read() == ([], -1)
    version = partition.append(5, -1)
    with pytest.raises(TopicError, match="ledger 5 is still open"):
        partition.append(6, version)
    version = partition.close(5, 41, 4200, version)
    with pytest.raises(PartitionChanged):
        partition.append(6, version - 1)  # a producer working from an old read loses
    with pytest.raises(TopicError, match="ledger 4 does not follow ledger 5"):
        partition.append(4, version)
    partition.append(6, version)
    ledgers, _ = partition.read()
    assert [(i.ledger_id, i.closed, i.last_entry_id, i.bytes) for i in ledgers] == [
        (5, True, 41, 4200),
        (6, False, -1, 0),
    ]


def test_topic_partitions_and_names(zk):
    assert Topic(zk, "plain").create(0) == 0
    assert [p.index for p in Topic(zk, "plain").partitions()] == [-1]
    Topic(zk, "split").create(3)
    assert [p.index for p in Topic(zk, "split").partitions()] == [0, 1, 2]
    assert Topic(zk, "split").create() == 3
    with pytest.raises(TopicError, match="exists with 3 partition"):
        Topic(zk, "split").create(2)
    with pytest.raises(TopicError, match="does not exist"):
        Topic(zk, "missing").partitions()
    with pytest.raises(TopicError, match="topic name 'a/b' is invalid"):
        Topic(zk, "a/b")
