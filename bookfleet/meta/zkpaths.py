"""Every ZooKeeper path bookfleet uses, defined once (BookKeeper-like layout under /ledgers).

    /ledgers/available/<bookieId>             ephemeral, JSON registration of a writable bookie
    /ledgers/available/readonly/<bookieId>    ephemeral, present while the bookie is read-only
    /ledgers/cookies/<bookieId>               the bookie's cookie (identity and data dirs)
    /ledgers/addresses/<bookieId>             persistent: the address the bookie last registered with
    /ledgers/bookiestate/<bookieId>           JSON {"readOnly": true, "reason": ...} while forced read-only
    /ledgers/idgen/ID-<seq>                   sequential nodes that hand out ledger ids
    /ledgers/00/0000/L0001                    ledger metadata (hierarchical: 10-digit id split 2/4/4)
    /ledgers/bookieindex/<bookieId>/<ledgerId> which ledgers have a segment on a bookie
    /ledgers/underreplication/...             markers, locks, switches and the auditor election
    /ledgers/topics/<topic>/<partition>       a partition's ordered ledger list
    /ledgers/writers/<ledgerId>               ephemeral lease of the one live writer of an open ledger
"""

from __future__ import annotations

ROOT = "/ledgers"
AVAILABLE = f"{ROOT}/available"
READONLY = f"{AVAILABLE}/readonly"
COOKIES = f"{ROOT}/cookies"
ADDRESSES = f"{ROOT}/addresses"
BOOKIE_STATE = f"{ROOT}/bookiestate"
IDGEN = f"{ROOT}/idgen"
IDGEN_PREFIX = f"{IDGEN}/ID-"
BOOKIE_INDEX = f"{ROOT}/bookieindex"
TOPICS = f"{ROOT}/topics"
WRITERS = f"{ROOT}/writers"

UNDERREPLICATION = f"{ROOT}/underreplication"
UR_LEDGERS = f"{UNDERREPLICATION}/ledgers"
UR_LOCKS = f"{UNDERREPLICATION}/locks"
UR_DISABLE = f"{UNDERREPLICATION}/disable"
UR_RECOVERY_DELAY = f"{UNDERREPLICATION}/lostBookieRecoveryDelay"
UR_DATALOSS = f"{UNDERREPLICATION}/dataloss"
AUDITOR_ELECTION = f"{UNDERREPLICATION}/auditorelection"

LEDGER_ID_DIGITS = 10
"""Ids below 10**10 use the 2/4/4 layout; larger ids keep their full width in the last level."""

NOT_LEDGER_DIRS = frozenset(
    {"available", "cookies", "addresses", "bookiestate", "idgen", "bookieindex", "underreplication", "topics"}
    | {"writers"}
)
"""Children of /ledgers that are not levels of the ledger-metadata hierarchy."""


def available(bookie_id: str) -> str:
    return f"{AVAILABLE}/{bookie_id}"


def readonly(bookie_id: str) -> str:
    return f"{READONLY}/{bookie_id}"


def cookie(bookie_id: str) -> str:
    return f"{COOKIES}/{bookie_id}"


def last_address(bookie_id: str) -> str:
    return f"{ADDRESSES}/{bookie_id}"


def bookie_state(bookie_id: str) -> str:
    return f"{BOOKIE_STATE}/{bookie_id}"


def ledger(ledger_id: int) -> str:
    """Metadata path of a ledger: id 1 lives at /ledgers/00/0000/L0001."""
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} is negative")
    digits = f"{ledger_id:0{LEDGER_ID_DIGITS}d}"
    return f"{ROOT}/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"


def ledger_id_from_path(path: str) -> int:
    """Inverse of ledger(): the id a metadata path names."""
    *_, top, mid, leaf = path.rstrip("/").split("/")
    if not leaf.startswith("L"):
        raise ValueError(f"{path!r} is not a ledger metadata path")
    return int(top + mid + leaf[1:])


def bookie_index(bookie_id: str) -> str:
    return f"{BOOKIE_INDEX}/{bookie_id}"


def bookie_index_entry(bookie_id: str, ledger_id: int) -> str:
    return f"{BOOKIE_INDEX}/{bookie_id}/{ledger_id}"


def _hex_levels(ledger_id: int) -> str:
    digits = f"{ledger_id:016x}"
    return "/".join(digits[i : i + 4] for i in range(0, 16, 4))


def underreplicated(ledger_id: int) -> str:
    """Marker of an under-replicated ledger: four 4-hex levels, then urL<id>."""
    return f"{UR_LEDGERS}/{_hex_levels(ledger_id)}/urL{ledger_id}"


def ledger_id_from_marker(path: str) -> int:
    leaf = path.rstrip("/").rsplit("/", 1)[-1]
    if not leaf.startswith("urL"):
        raise ValueError(f"{path!r} is not an under-replication marker")
    return int(leaf[3:])


def underreplication_lock(ledger_id: int) -> str:
    return f"{UR_LOCKS}/urL{ledger_id}"


def dataloss(ledger_id: int) -> str:
    return f"{UR_DATALOSS}/L{ledger_id}"


def ledger_id_from_dataloss(path: str) -> int:
    """Inverse of dataloss()."""
    parent, _, leaf = path.rstrip("/").rpartition("/")
    if parent != UR_DATALOSS or not leaf.startswith("L"):
        raise ValueError(f"{path!r} is not a DATA_LOSS record")
    return int(leaf[1:])


def ledger_writer(ledger_id: int) -> str:
    return f"{WRITERS}/{ledger_id}"


def topic(name: str) -> str:
    return f"{TOPICS}/{name}"


def partition(name: str, index: int) -> str:
    return f"{TOPICS}/{name}/{index}"
