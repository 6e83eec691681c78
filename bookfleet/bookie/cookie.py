"""The cookie: which bookie a set of disks belongs to, kept on each disk and in ZooKeeper (bookfleet.meta.cookies).

A bookie that starts on the wrong disks would serve (or silently lack) another bookie's ledgers, so every mismatch
refuses to start with a message that says which case it is. Fresh disks and no ZooKeeper cookie: both are created
(disks first, so a crash in between is reported as "ZooKeeper has none" rather than passing silently). Beside the
cookie (BookKeeper's format, which names the cluster, not the bookie's registration) each disk keeps the ZooKeeper
cookie's incarnation, so a disk of an earlier registration of the same bookie is refused too; a disk without one
(a crash right after the ZooKeeper cookie was made) takes the current one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from kazoo.client import KazooClient

from bookfleet.meta import cookies, layout
from bookfleet.meta.cookies import Cookie, CookieMismatch

COOKIE_FILE = "COOKIE"
INCARNATION_FILE = "COOKIE.incarnation"


def _read_disk(directory: Path) -> Cookie | None:
    path = directory / COOKIE_FILE
    try:
        cookie = Cookie.decode(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None
    try:
        return replace(cookie, incarnation=int((directory / INCARNATION_FILE).read_text()))
    except FileNotFoundError:
        return cookie


def _write_disk(directory: Path, cookie: Cookie) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write_file(directory, COOKIE_FILE, cookie.encode())
    if cookie.incarnation:
        _write_file(directory, INCARNATION_FILE, str(cookie.incarnation).encode())


def _write_file(directory: Path, name: str, data: bytes) -> None:
    """Replace `name` atomically and durably."""
    tmp = directory / f"{name}.tmp"
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, directory / name)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_or_create(zk: KazooClient, bookie_id: str, journal_dir: Path, ledger_dir: Path) -> Cookie:
    """Check that these dirs are this bookie's and ZooKeeper agrees; create the cookie on first start."""
    dirs = {"journal dir": Path(journal_dir), "ledger dir": Path(ledger_dir)}
    on_disk = {name: _read_disk(path) for name, path in dirs.items()}
    for name, cookie in on_disk.items():
        if cookie is not None and cookie.bookieId != bookie_id:
            raise CookieMismatch(
                f"{name} {dirs[name]} belongs to bookie {cookie.bookieId}, not {bookie_id}: "
                "was the disk moved to another bookie?"
            )
    cluster = layout.initialize(zk)
    registered = cookies.read(zk, bookie_id)

    if registered is None:
        present = [f"{name} {dirs[name]}" for name, cookie in on_disk.items() if cookie is not None]
        if present:
            raise CookieMismatch(
                f"{' and '.join(present)} hold a cookie for bookie {bookie_id} but ZooKeeper has none: "
                "the bookie was decommissioned or ZooKeeper was reset; wipe the disks to rejoin as a new bookie"
            )
        return _create(zk, bookie_id, dirs, cluster)

    for name, cookie in on_disk.items():
        if cookie is None:
            raise CookieMismatch(
                f"ZooKeeper has a cookie for bookie {bookie_id} but its {name} {dirs[name]} has none: "
                "the disk was wiped or replaced, so its ledgers are gone (decommission the bookie to rejoin)"
            )
        if cookie.instanceId != registered.instanceId:
            raise CookieMismatch(
                f"{name} {dirs[name]} has instance {cookie.instanceId} but ZooKeeper's cookie for bookie "
                f"{bookie_id} has instance {registered.instanceId}: the disk is from another cluster"
            )
        if cookie.incarnation not in (0, registered.incarnation):
            raise CookieMismatch(
                f"{name} {dirs[name]} has incarnation {cookie.incarnation} but ZooKeeper's cookie for bookie "
                f"{bookie_id} has incarnation {registered.incarnation}: the disk is from another incarnation of it"
            )
    for name, cookie in on_disk.items():
        if cookie is not None and not cookie.incarnation:
            _write_file(dirs[name], INCARNATION_FILE, str(registered.incarnation).encode())
    return registered


def _create(zk: KazooClient, bookie_id: str, dirs: dict[str, Path], cluster: str) -> Cookie:
    journal_dir, ledger_dir = dirs["journal dir"], dirs["ledger dir"]
    cookie = Cookie(bookie_id, str(journal_dir), str(ledger_dir), cluster)
    for directory in dirs.values():
        _write_disk(directory, cookie)
    registered = cookies.create(zk, cookie)
    for directory in dirs.values():
        _write_disk(directory, registered)
    return registered
