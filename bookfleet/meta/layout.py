"""The cluster's identity nodes, as Apache BookKeeper lays them out: /ledgers/LAYOUT, /ledgers/INSTANCEID and
underreplication/LAYOUT.

`initialize(zk)` is what a BookKeeper bookie's or client's first start does: create what is missing, check what is
there. Every bookfleet bookie and client calls it before it reads or writes a record, so a fleet whose ZooKeeper
still holds bookfleet's records from before the BookKeeper formats stops at once with one clear line (there is no
upgrade of those), instead of failing later on the first record it meets.
"""

from __future__ import annotations

import contextlib
import uuid

from google.protobuf import text_format
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from bookfleet.meta import zkpaths
from bookfleet.meta.formats import LedgerRereplicationLayoutFormat
from bookfleet.meta.metadata import OLD_FORMAT_ADVICE

LEDGER_MANAGER = "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory"
LAYOUT = f"2\n{LEDGER_MANAGER}:1".encode()
"""Layout format 2, then the ledger manager factory and its version: BookKeeper's hierarchical ledger manager, whose
paths zkpaths.ledger() names."""
UNDERREPLICATION_LAYOUT = text_format.MessageToString(
    LedgerRereplicationLayoutFormat(type="BASIC", version=1)
).encode()


class LayoutError(RuntimeError):
    """ZooKeeper holds a layout bookfleet cannot use; the message says which and what to do."""


def initialize(zk: KazooClient) -> str:
    """Create the layout nodes that are missing, check those present; returns the cluster's instance id."""
    try:
        layout, _ = zk.get(zkpaths.LAYOUT)
    except NoNodeError:
        _refuse_old_records(zk)
        layout = _create_once(zk, zkpaths.LAYOUT, LAYOUT)
    manager = layout.decode(errors="replace").partition("\n")[2].partition(":")[0]
    if manager != LEDGER_MANAGER:
        raise LayoutError(f"{zkpaths.LAYOUT} names ledger manager {manager!r}; bookfleet reads only {LEDGER_MANAGER}")
    _create_once(zk, zkpaths.UR_LAYOUT, UNDERREPLICATION_LAYOUT)
    with contextlib.suppress(NodeExistsError):
        zk.ensure_path(zkpaths.READONLY)
    return _create_once(zk, zkpaths.INSTANCE_ID, str(uuid.uuid4()).encode()).decode()


def instance_id(zk: KazooClient) -> str:
    """The cluster's INSTANCEID (initialize() creates it)."""
    return zk.get(zkpaths.INSTANCE_ID)[0].decode()


def _create_once(zk: KazooClient, path: str, data: bytes) -> bytes:
    """The node's data: `data` if this call created it, else what another process created first."""
    try:
        zk.create(path, data, makepath=True)
        return data
    except NodeExistsError:
        return zk.get(path)[0]


def _refuse_old_records(zk: KazooClient) -> None:
    """A fleet without a LAYOUT whose bookies left JSON cookies is one of an earlier bookfleet."""
    try:
        names = zk.get_children(zkpaths.COOKIES)
    except NoNodeError:
        return
    for name in names[:1]:
        with contextlib.suppress(NoNodeError):
            if zk.get(zkpaths.cookie(name))[0].startswith(b"{"):
                raise LayoutError(f"ZooKeeper's {zkpaths.ROOT} holds bookfleet's old JSON records; {OLD_FORMAT_ADVICE}")
