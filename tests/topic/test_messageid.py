"""MessageId: total order, `ledgerId:entryId:partition:batchIndex` round trip, clear errors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookfleet.topic.messageid import BadMessageId, MessageId

ids = st.builds(
    MessageId,
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(0, 2**63 - 1),
    partition=st.integers(-1, 1000),
    batch_index=st.integers(-1, 1000),
)


@given(ids)
def test_str_and_parse_round_trip(message_id):
    text = str(message_id)
    assert text == (f"{message_id.ledger_id}:{message_id.entry_id}:{message_id.partition}:{message_id.batch_index}")
    assert MessageId.parse(text) == message_id


@given(ids, ids)
def test_order_is_ledger_then_entry_then_partition_then_batch(a, b):
    key = (a.ledger_id, a.entry_id, a.partition, a.batch_index)
    other = (b.ledger_id, b.entry_id, b.partition, b.batch_index)
    assert (a < b) == (key < other)
    assert (a == b) == (key == other)


def test_later_ledger_sorts_after_every_entry_of_an_earlier_one():
    assert MessageId(7, 10**9, 0, 5) < MessageId(8, 0, 0, -1)
    assert MessageId(7, 3, 0, -1) < MessageId(7, 3, 0, 0) < MessageId(7, 4, 0, -1)
    assert str(MessageId(12, 3)) == "12:3:-1:-1"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("1:2:3", "has 3 part(s)"),
        ("1:2:3:4:5", "has 5 part(s)"),
        ("a:2:3:4", "ledgerId 'a' is not an integer"),
        ("1:2.5:3:4", "entryId '2.5' is not an integer"),
        ("1:2:-2:4", "partition -2 is below -1"),
        ("1:-1:0:0", "entryId -1 is below 0"),
        ("1:2:0:1_0", "batchIndex '1_0' is not an integer"),
        ("", "has 1 part(s)"),
    ],
)
def test_bad_strings_name_what_is_wrong(text, complaint):
    with pytest.raises(BadMessageId) as caught:
        MessageId.parse(text)
    assert complaint in str(caught.value)
