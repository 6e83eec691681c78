"""The entry log's write-behind: a flush's bytes go to the disk a piece at a time while it appends, so its final
sync (and the journal's fdatasync ext4 commits with it) does not wait for tens of megabytes at once."""

from __future__ import annotations

from bookfleet.bookie.entrylog import WRITE_BEHIND_PIECE, EntryLogger, write_behind

PIECE = WRITE_BEHIND_PIECE


def test_each_whole_piece_is_started_after_the_piece_two_before_it_is_written():
    assert write_behind(0, PIECE - 1) == []  # no whole piece yet: nothing started
    assert write_behind(0, 3 * PIECE + 10) == [(None, 0), (None, PIECE), (0, 2 * PIECE)]
    # the next append takes up where the last left off, the tail of a piece waiting for the rest of it
    assert write_behind(3 * PIECE, 5 * PIECE) == [(PIECE, 3 * PIECE), (2 * PIECE, 4 * PIECE)]
    assert write_behind(5 * PIECE, 5 * PIECE + PIECE // 2) == []


def test_entries_appended_with_writeback_started_along_the_way_and_across_a_roll_read_back(tmp_path):
    logger = EntryLogger(tmp_path, roll_bytes=3 * PIECE)
    entries = [bytes([entry_id % 251]) * 4000 for entry_id in range(1000)]  # ~4 MB: pieces started in two logs
    written = []
    for first in range(0, len(entries), 100):
        ids = list(range(first, first + 100))
        written += logger.append([(7, ids, entries[first : first + 100])])
    logger.sync()
    assert len({log_id for _, _, log_id, *_ in written}) >= 2
    located = 0
    for _, ids, log_id, offsets, sizes, _ in written:
        for index, entry_id in enumerate(ids):
            offset = int.from_bytes(offsets[8 * index : 8 * index + 8], "little")
            size = int.from_bytes(sizes[4 * index : 4 * index + 4], "little")
            assert logger.read(log_id, offset, size) == entries[entry_id]
            located += 1
    assert located == len(entries)
    logger.close()
