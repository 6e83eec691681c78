"""Forced read-only: a bookie told from outside (operator, `bookfleet bookies readonly`) to stop taking adds.

`zkpaths.bookie_state(id)` holds `{"readOnly": true, "reason": "..."}` while the bookie is forced read-only; no node
means not forced. The bookie follows the node with a watch (level-based: what the node says when it connects is what
it does) and is read-only while either this switch or its own disk monitor says so.
"""

from __future__ import annotations

import contextlib

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bookfleet.meta import zkpaths


class ForcedState(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    read_only: bool = Field(alias="readOnly")
    reason: str = ""

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


def parse(bookie_id: str, data: bytes | None) -> ForcedState | None:
    """The state a node's data says (None for no node or an empty one); ValueError names a malformed node."""
    if not data:
        return None
    try:
        return ForcedState.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"{zkpaths.bookie_state(bookie_id)} is not valid bookie-state JSON: {exc}") from None


def read(zk: KazooClient, bookie_id: str) -> ForcedState | None:
    try:
        data, _ = zk.get(zkpaths.bookie_state(bookie_id))
    except NoNodeError:
        return None
    return parse(bookie_id, data)


def forced_ids(zk: KazooClient) -> set[str]:
    """Ids of the bookies that have a state node (one listing, for level-based passes over many bookies)."""
    try:
        return set(zk.get_children(zkpaths.BOOKIE_STATE))
    except NoNodeError:
        return set()


def set_read_only(zk: KazooClient, bookie_id: str, reason: str) -> None:
    """Force the bookie read-only (creates or overwrites its node)."""
    path, data = zkpaths.bookie_state(bookie_id), ForcedState(read_only=True, reason=reason).to_json()
    try:
        zk.create(path, data, makepath=True)
    except NodeExistsError:
        zk.set(path, data)


def clear(zk: KazooClient, bookie_id: str) -> None:
    """Lift the forced read-only state (the bookie stays read-only only if its disk is too full)."""
    with contextlib.suppress(NoNodeError):
        zk.delete(zkpaths.bookie_state(bookie_id))
