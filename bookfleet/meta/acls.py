"""Putting the fleet's ACL on nodes created before the fleet had a credential.

A fleet that ran without ZooKeeper authentication left its nodes with ZooKeeper's open default (world: all). Turning
the credential on protects only what is created afterwards; `secure_tree` walks the ledgers root and sets the
fleet's ACL on every node whose ACL differs, so the whole tree answers only to the credential. It is idempotent
(a second run changes nothing) and safe while the fleet runs: each change is a compare-and-set on the node's ACL
version, retried when the ACL changed meanwhile, and nodes that vanish during the walk are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.security import ACL

from bookfleet.meta import zkpaths


@dataclass
class AclReport:
    """What `secure_tree` saw: nodes looked at, the paths it changed and those this session may not change."""

    nodes: int = 0
    changed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def secure_tree(zk: KazooClient, acl: list[ACL], root: str = zkpaths.ROOT) -> AclReport:
    """Set `acl` on `root` and every node below it whose ACL differs; `zk` must be authenticated as `acl` names,
    or the fleet would lock itself out. A node whose ACL this session may not change is reported, not fatal."""
    report = AclReport()
    wanted = sorted(acl)
    pending = [root]
    while pending:
        path = pending.pop()
        try:
            if _secure_node(zk, path, acl, wanted):
                report.changed.append(path)
            children = zk.get_children(path)
        except NoNodeError:
            continue  # deleted during the walk
        except NoAuthError:
            report.refused.append(path)
            continue
        report.nodes += 1
        pending.extend(f"{path.rstrip('/')}/{child}" for child in children)
    return report


def _secure_node(zk: KazooClient, path: str, acl: list[ACL], wanted: list[ACL]) -> bool:
    """Give `path` the ACL `acl`; True if it had another one."""
    while True:
        current, stat = zk.get_acls(path)
        if sorted(current) == wanted:
            return False
        try:
            zk.set_acls(path, acl, version=stat.aversion)
            return True
        except BadVersionError:
            continue
