"""The disk monitor's read-only switch (bookie/diskmonitor.py) with a quota: the quota decides, the real filesystem's
free space caps it."""

from __future__ import annotations

import os
from pathlib import Path

from bookfleet.bookie import diskmonitor

GIB = 2**30


def filesystem(total: int, free: int, block: int = 4096) -> os.statvfs_result:
    """What statvfs says of a filesystem of `total` bytes with `free` of them available."""
    return os.statvfs_result((block, block, total // block, free // block, free // block, 0, 0, 0, 0, 255))


def monitor(tmp_path: Path, quota: int, used: int, changes: list) -> diskmonitor.DiskMonitor:
    return diskmonitor.DiskMonitor(tmp_path, lambda: used, lambda *change: changes.append(change),
                                   threshold=0.95, low_water_mark=0.9, recovery_limit=0.98, quota=quota)


def test_a_quota_larger_than_the_filesystem_still_turns_read_only_when_the_disk_fills(tmp_path, monkeypatch):
    """A refused volume expansion once left a --disk-quota of 20 GiB on a 10 GiB disk: the monitor counted only the
    bookie's bytes against the quota and never turned read-only, and the bookie wrote on to ENOSPC."""
    monkeypatch.setattr(diskmonitor.os, "statvfs", lambda path: filesystem(10 * GIB, GIB // 4))
    changes: list = []
    watching = monitor(tmp_path, quota=20 * GIB, used=9 * GIB, changes=changes)
    watching.check()
    room = 9 * GIB + GIB // 4  # what the bookie holds and the disk's free space, not the quota
    assert watching.read_only and changes == [(True, GIB // 4, room)]
    assert 0 < watching.reserve_left < GIB // 4  # recovery adds may not take what the disk does not have


def test_a_quota_larger_than_the_filesystem_turns_writable_again_once_the_bookies_bytes_shrink(tmp_path, monkeypatch):
    """A bookie filled past its threshold and then emptied (a deleted ledger collected) takes adds again, although
    its quota is more than the whole disk (the chaos run's sparse ballast on a 10^12-byte quota)."""
    monkeypatch.setattr(diskmonitor.os, "statvfs", lambda path: filesystem(100 * GIB, 80 * GIB))
    used, changes = [10**12], []
    watching = diskmonitor.DiskMonitor(tmp_path, lambda: used[0], lambda *change: changes.append(change),
                                       threshold=0.95, low_water_mark=0.9, recovery_limit=0.98, quota=10**12)
    watching.check()
    assert watching.read_only
    used[0] = GIB
    watching.check()
    assert not watching.read_only and changes[-1] == (False, 80 * GIB, 81 * GIB)


def test_with_room_on_the_disk_the_quota_still_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(diskmonitor.os, "statvfs", lambda path: filesystem(100 * GIB, 90 * GIB))
    changes: list = []
    watching = monitor(tmp_path, quota=GIB, used=GIB - 2**20, changes=changes)
    watching.check()
    assert watching.read_only and changes == [(True, 2**20, GIB)]
