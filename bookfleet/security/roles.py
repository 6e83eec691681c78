"""Who may do what on the bookie protocol: roles, principals and the one table of permissions per operation.

The principal is the subject of the peer's certificate; its roles are the subject's OU values. A bookie with TLS
asks `authorize` before every request; without TLS there is no principal and nothing to check.

    client      create, write, read and recover ledgers: plain and recovery adds, reads, fence, LAC, force
    replicator  repair: recovery adds, reads, fence; also recovery adds to ledgers already closed (copies of
                their fragments onto replacement bookies), which a client never needs
    admin       everything above; the switches and decommissioning live in ZooKeeper behind its credential
    bookie      presented by bookies as servers; a client checks it so no other certificate can pose as a bookie
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bookfleet.bkprotocol import OperationType as Op


class Role(enum.StrEnum):
    CLIENT = "client"
    REPLICATOR = "replicator"
    ADMIN = "admin"
    BOOKIE = "bookie"


class Forbidden(Exception):
    """The principal lacks the role an operation needs; the message names both."""


@dataclass(frozen=True)
class Principal:
    """An authenticated peer: its certificate subject and the roles it carries."""

    subject: str
    roles: frozenset[Role]

    @classmethod
    def from_peercert(cls, peercert: dict) -> Principal:
        """From `ssl.SSLSocket.getpeercert()`: subject as `CN=..,OU=..,O=..`, roles from the OU values."""
        attributes = [pair for rdn in peercert.get("subject", ()) for pair in rdn]
        subject = ",".join(f"{_SHORT_NAMES.get(key, key)}={value}" for key, value in attributes)
        units = [value for key, value in attributes if key == "organizationalUnitName"]
        roles = frozenset(Role(unit) for unit in units if unit in _ROLES)
        return cls(subject, roles)

    def has(self, *roles: Role) -> bool:
        return not self.roles.isdisjoint(roles)


BEFORE_TLS = Principal("no certificate (plain, before START_TLS)", frozenset())
"""A peer on a plain connection to a TLS bookie that has not asked START_TLS yet: no role at all, so the one table
refuses it everything that needs one (AUTH and START_TLS need none)."""

_ROLES = frozenset(Role)
_SHORT_NAMES = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O"}

_READERS = (Role.CLIENT, Role.REPLICATOR, Role.ADMIN)
_WRITERS = (Role.CLIENT, Role.ADMIN)
_ANYONE = tuple(Role)
_PERMISSIONS: dict[tuple[int, bool], tuple[Role, ...]] = {
    # (op, with its special flag: RECOVERY_ADD for adds, FENCE for reads) -> roles allowed
    (Op.ADD_ENTRY, False): _WRITERS,
    (Op.ADD_ENTRY, True): _READERS,
    (Op.READ_ENTRY, False): _READERS,
    (Op.READ_ENTRY, True): _READERS,
    (Op.READ_RANGE, False): _READERS,
    (Op.READ_LAC, False): _READERS,
    (Op.WRITE_LAC, False): _WRITERS,
    (Op.RAISE_EPOCH, False): _WRITERS,
    (Op.FORCE_LEDGER, False): _WRITERS,
    (Op.GET_BOOKIE_INFO, False): _ANYONE,
}
CLOSED_LEDGER_WRITERS = (Role.REPLICATOR, Role.ADMIN)
"""Who may add (with RECOVERY_ADD) to a ledger whose metadata says it is closed: the repair, never a client."""

_SPECIAL_FLAG = {Op.ADD_ENTRY: "RECOVERY_ADD", Op.READ_ENTRY: "FENCE"}


def _operation_name(op: int, special: bool) -> str:
    name = Op(op).name
    if special:
        name += " with " + _SPECIAL_FLAG[op]
    return name


def _require(principal: Principal, allowed: tuple[Role, ...], what: str) -> None:
    if not principal.has(*allowed):
        raise Forbidden(
            f"{principal.subject} may not {what}: needs role {' or '.join(allowed) or 'none'}, "
            f"has {', '.join(sorted(principal.roles)) or 'none'}"
        )


def authorize(principal: Principal, op: int, special: bool = False) -> None:
    """Raise Forbidden unless `principal` may send `op` (with its special flag when `special`: a recovery add, a
    fencing read)."""
    _require(principal, _PERMISSIONS.get((op, special), ()), _operation_name(op, special))


def authorize_closed_ledger_add(principal: Principal, ledger_id: int) -> None:
    """Raise Forbidden unless `principal` may copy entries into closed ledger `ledger_id`."""
    _require(principal, CLOSED_LEDGER_WRITERS, f"add to closed ledger {ledger_id}")
