"""Every ZooKeeper path bookfleet uses, defined once: Apache BookKeeper 4.17's layout under /ledgers, with
bookfleet's own nodes beside it where a BookKeeper peer never looks.

    /ledgers/LAYOUT                           the ledger manager (BookKeeper's hierarchical one), created once
    /ledgers/INSTANCEID                       the cluster's id, in every bookie's cookie
    /ledgers/available/<bookieId>             ephemeral, BookieServiceInfoFormat of a writable bookie
    /ledgers/available/readonly/<bookieId>    ephemeral, the same while the bookie is read-only
    /ledgers/cookies/<bookieId>               the bookie's cookie (identity and data dirs, CookieFormat text)
    /ledgers/addresses/<bookieId>             persistent: the address the bookie last registered with
    /ledgers/bookiestate/<bookieId>           JSON {"readOnly": true, "reason": ...} while forced read-only
    /ledgers/idgen/ID-<seq>                   sequential nodes that hand out ledger ids below 2^31 - 1
    /ledgers/idgen-long/HOB-<high>/ID-<seq>   and past them: high 32 bits from the newest HOB level, low from its seq
    /ledgers/00/0000/L0001                    ledger metadata, ids below 2^31 - 1: 10 digits split 2/4/4
    /ledgers/000/0000/0000/0000/L0001         ledger metadata, larger ids: 19 digits split 3/4/4/4/4
    /ledgers/underreplication/...             markers (urL%010d), locks, LAYOUT, switches, the auditor election
    /ledgers/underreplication/bookfleetreasons/urL%010d   bookfleet's reasons of a marker (JSON)
    /ledgers/underreplication/checkallledgersctime        when an auditor last finished checking every ledger
    /ledgers/topics/<topic>/<partition>       a partition's ordered ledger list
    /ledgers/writers/<ledgerId>               ephemeral lease of the one live writer of an open ledger
"""

from __future__ import annotations

ROOT = "/ledgers"
LAYOUT = f"{ROOT}/LAYOUT"
INSTANCE_ID = f"{ROOT}/INSTANCEID"
AVAILABLE = f"{ROOT}/available"
READONLY = f"{AVAILABLE}/readonly"
COOKIES = f"{ROOT}/cookies"
ADDRESSES = f"{ROOT}/addresses"
BOOKIE_STATE = f"{ROOT}/bookiestate"
IDGEN = f"{ROOT}/idgen"
IDGEN_PREFIX = f"{IDGEN}/ID-"
IDGEN_LONG = f"{ROOT}/idgen-long"
HIGH_BITS_PREFIX = "HOB-"
TOPICS = f"{ROOT}/topics"
WRITERS = f"{ROOT}/writers"

UNDERREPLICATION = f"{ROOT}/underreplication"
UR_LAYOUT = f"{UNDERREPLICATION}/LAYOUT"
UR_LEDGERS = f"{UNDERREPLICATION}/ledgers"
UR_LOCKS = f"{UNDERREPLICATION}/locks"
UR_DISABLE = f"{UNDERREPLICATION}/disable"
UR_RECOVERY_DELAY = f"{UNDERREPLICATION}/lostBookieRecoveryDelay"
UR_DATALOSS = f"{UNDERREPLICATION}/dataloss"
UR_REASONS = f"{UNDERREPLICATION}/bookfleetreasons"
UR_CHECK_ALL_LEDGERS_CTIME = f"{UNDERREPLICATION}/checkallledgersctime"
AUDITOR_ELECTION = f"{UNDERREPLICATION}/auditorelection"
AUDITOR_VOTE_PREFIX = f"{AUDITOR_ELECTION}/V_"

SHORT_ID_LIMIT = 2**31 - 1
"""Ids below this (Java's Integer.MAX_VALUE) use the 2/4/4 layout, the others the 3/4/4/4/4 one."""
SHORT_TOP_DIGITS, LONG_TOP_DIGITS = 2, 3
"""The width of a first level tells the two layouts apart; no other child of /ledgers is all digits."""


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
    """Metadata path of a ledger, as BookKeeper's hierarchical ledger manager names it: id 1 lives at
    /ledgers/00/0000/L0001, id 2^31 - 1 and above at /ledgers/000/0000/0002/1474/L7647."""
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} is negative")
    if ledger_id < SHORT_ID_LIMIT:
        digits = f"{ledger_id:010d}"
        return f"{ROOT}/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"
    digits = f"{ledger_id:019d}"
    return f"{ROOT}/{digits[:3]}/{digits[3:7]}/{digits[7:11]}/{digits[11:15]}/L{digits[15:]}"


def ledger_id_from_path(path: str) -> int:
    """Inverse of ledger(): the id a metadata path names (either layout)."""
    levels = path.removeprefix(ROOT + "/").rstrip("/").split("/")
    if len(levels) not in (3, 5) or not levels[-1].startswith("L"):
        raise ValueError(f"{path!r} is not a ledger metadata path")
    return int("".join(levels[:-1]) + levels[-1][1:])


def holds_ledgers(level: str) -> bool:
    """Whether a level of the metadata hierarchy is the last one, whose children are ledgers."""
    names = level.removeprefix(ROOT + "/").split("/")
    return len(names) == (2 if len(names[0]) == SHORT_TOP_DIGITS else 4)


def is_ledger_level(name: str, depth: int = 0) -> bool:
    """Whether a child of /ledgers (depth 0) or of a level below it is part of the metadata hierarchy."""
    if depth == 0:
        return name.isdigit() and len(name) in (SHORT_TOP_DIGITS, LONG_TOP_DIGITS)
    return name.isdigit() and len(name) == 4


def _hex_levels(ledger_id: int) -> str:
    digits = f"{ledger_id:016x}"
    return "/".join(digits[i : i + 4] for i in range(0, 16, 4))


def underreplicated(ledger_id: int) -> str:
    """Marker of an under-replicated ledger: four 4-hex levels, then urL and the id in at least 10 digits."""
    return f"{UR_LEDGERS}/{_hex_levels(ledger_id)}/urL{ledger_id:010d}"


def ledger_id_from_marker(path: str) -> int:
    leaf = path.rstrip("/").rsplit("/", 1)[-1]
    if not leaf.startswith("urL"):
        raise ValueError(f"{path!r} is not an under-replication marker")
    return int(leaf[3:])


def high_bits(high: int) -> str:
    """The id generator's level of ids whose high 32 bits are `high` (once 31-bit ids ran out)."""
    return f"{IDGEN_LONG}/{HIGH_BITS_PREFIX}{high:010d}"


def marker_reasons(ledger_id: int) -> str:
    """bookfleet's side node of a marker: why it names its bookies (BookKeeper never reads it)."""
    return f"{UR_REASONS}/urL{ledger_id:010d}"


def underreplication_lock(ledger_id: int) -> str:
    return f"{UR_LOCKS}/urL{ledger_id:010d}"


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
