"""Ledger metadata in ZooKeeper: one znode per ledger in Apache BookKeeper's format 3, changed only by compare-and-set.

A record is the line `BookieMetadataFormatVersion\t3\n` and a varint-length-delimited binary LedgerMetadataFormat
(formats.py); format 2 (the same message as protobuf text) is read too. It holds the password in plain, as
BookKeeper's does (ZooKeeper's ACL guards it). What bookfleet adds, the writer epoch, rides in customMetadata under
`bookfleet.` keys, which a Java client keeps when it rewrites the record and never interprets.

There is no index of ledgers by bookie beside the metadata (a Java client would not keep one): "which ledgers live
on this bookie" is a scan of every ledger's metadata (`ledgers_by_bookie`), as BookKeeper's auditor does it.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from google.protobuf import text_format
from google.protobuf.internal.decoder import _DecodeVarint
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bookfleet import wire
from bookfleet.meta import zkpaths
from bookfleet.meta.formats import LedgerMetadataFormat
from bookfleet.meta.zk import read_many

log = logging.getLogger(__name__)

FORMAT_HEADER = b"BookieMetadataFormatVersion\t"
FORMAT_VERSION = 3
BOOKFLEET_KEY_PREFIX = "bookfleet."
WRITER_EPOCH_KEY = f"{BOOKFLEET_KEY_PREFIX}writerEpoch"
OLD_FORMAT_ADVICE = (
    "this bookfleet reads and writes only Apache BookKeeper's formats and has no upgrade for a fleet of an earlier "
    "bookfleet: start it on a new ZooKeeper (or chroot) and new disks"
)
PROTO_DIGEST_TYPES = {"CRC32": "CRC32", "MAC": "HMAC", "CRC32C": "CRC32C", "DUMMY": "DUMMY"}
"""wire.DigestType member name -> BookKeeper's DigestType name (BookKeeper calls its MAC digest HMAC here)."""


class MetadataError(Exception):
    """Base of the metadata errors; each message names the ledger and what went wrong."""


class NoSuchLedgerError(MetadataError):
    def __init__(self, ledger_id: int):
        super().__init__(f"ledger {ledger_id} does not exist")
        self.ledger_id = ledger_id


class MetadataVersionConflict(MetadataError):
    """Someone else changed the metadata since it was read: re-read, re-apply, retry."""

    def __init__(self, ledger_id: int, expected_version: int):
        super().__init__(f"metadata of ledger {ledger_id} changed since version {expected_version} was read")
        self.ledger_id = ledger_id
        self.expected_version = expected_version


class LedgerState(enum.StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class Segment(BaseModel):
    """The ensemble that stores entries from `first_entry_id` until the next segment starts."""

    model_config = ConfigDict(frozen=True)

    first_entry_id: int = Field(ge=0)
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fragment:
    """A segment with its entry range; `last_entry_id` is None while the ledger is open and this is the tail."""

    index: int
    first_entry_id: int
    last_entry_id: int | None
    bookies: tuple[str, ...]

    @property
    def is_empty(self) -> bool:
        return self.last_entry_id is not None and self.last_entry_id < self.first_entry_id

    def entry_ids(self) -> range:
        """The entry ids of a closed fragment (an open tail has no known end)."""
        if self.last_entry_id is None:
            raise ValueError(f"fragment {self.index} starting at entry {self.first_entry_id} is still open")
        return range(self.first_entry_id, self.last_entry_id + 1)


class LedgerMetadata(BaseModel):
    """What ZooKeeper knows of one ledger. Immutable: derive changed copies with the `with_*` helpers."""

    model_config = ConfigDict(frozen=True)

    ensemble_size: int = Field(ge=1)
    write_quorum: int = Field(ge=1)
    ack_quorum: int = Field(ge=1)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = Field(default=wire.INVALID_ENTRY_ID, ge=wire.INVALID_ENTRY_ID)
    length: int = Field(default=0, ge=0)
    segments: tuple[Segment, ...]
    digest_type: wire.DigestType = wire.DigestType.CRC32C
    password: bytes = Field(default=b"", repr=False, exclude=True)
    """In plain, as BookKeeper keeps it (its clients derive the master key and MAC key from it); never printed."""
    ctime: float = Field(default_factory=lambda: round(time.time(), 3))
    """Seconds, kept to the millisecond BookKeeper stores."""
    custom: dict[str, str] = Field(default_factory=dict)
    """The application's customMetadata (bytes values read as UTF-8, other bytes kept by surrogateescape)."""
    c_token: int = 0
    """BookKeeper's cToken: kept as read, 0 for bookfleet's own ledgers."""
    writer_epoch: int = Field(default=0, ge=0, le=wire.INT64_MAX)
    """Raised by every reopen (compare-and-set): the writer holding it is the only one bookies take adds from.
    Stored in customMetadata (WRITER_EPOCH_KEY); a ledger a Java client created has none and reads as 0, the epoch
    of a ledger's creating writer."""

    @model_validator(mode="after")
    def _check_invariants(self) -> LedgerMetadata:
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not e >= qw >= qa >= 1:
            raise ValueError(f"need ensemble >= write quorum >= ack quorum >= 1, got E={e} Qw={qw} Qa={qa}")
        if not self.segments:
            raise ValueError("a ledger needs at least one segment")
        if self.segments[0].first_entry_id != 0:
            raise ValueError(f"the first segment must start at entry 0, not {self.segments[0].first_entry_id}")
        for previous, segment in zip(self.segments, self.segments[1:], strict=False):
            if segment.first_entry_id <= previous.first_entry_id:
                raise ValueError(
                    f"segment first entry ids must strictly increase: {segment.first_entry_id} "
                    f"follows {previous.first_entry_id}"
                )
        for segment in self.segments:
            if len(segment.bookies) != e or len(set(segment.bookies)) != e:
                raise ValueError(
                    f"segment at entry {segment.first_entry_id} needs {e} distinct bookies, got "
                    f"{', '.join(segment.bookies) or 'none'}"
                )
        if self.state == LedgerState.CLOSED and self.last_entry_id == wire.INVALID_ENTRY_ID and self.length:
            raise ValueError(f"an empty closed ledger cannot have length {self.length}")
        if reserved := sorted(key for key in self.custom if key.startswith(BOOKFLEET_KEY_PREFIX)):
            raise ValueError(f"custom metadata keys starting with {BOOKFLEET_KEY_PREFIX!r} are bookfleet's: {reserved}")
        return self

    # --- reading --------------------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    def segment_for(self, entry_id: int) -> Segment:
        """The segment whose ensemble stores `entry_id`."""
        if entry_id < 0:
            raise ValueError(f"entry id {entry_id} is negative")
        found = self.segments[0]
        for segment in self.segments:
            if segment.first_entry_id > entry_id:
                break
            found = segment
        return found

    def bookies(self) -> set[str]:
        """Every bookie named by any segment."""
        return {bookie for segment in self.segments for bookie in segment.bookies}

    def fragments(self) -> list[Fragment]:
        """Segments with their entry ranges; the tail of an unclosed ledger is open-ended."""
        fragments = []
        for index, segment in enumerate(self.segments):
            if index + 1 < len(self.segments):
                last: int | None = self.segments[index + 1].first_entry_id - 1
            else:
                last = self.last_entry_id if self.is_closed else None
            fragments.append(Fragment(index, segment.first_entry_id, last, segment.bookies))
        return fragments

    # --- deriving changed copies (validated) ----------------------------------------------------------------

    def password_matches(self, password: bytes) -> bool:
        return hmac.compare_digest(self.password, password)

    def _with(self, **changes: object) -> LedgerMetadata:
        return LedgerMetadata.model_validate({**dict(self), **changes})

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return self._with(state=state)

    def with_next_writer_epoch(self) -> LedgerMetadata:
        """A reopening writer's metadata: stored by compare-and-set, it makes every earlier writer's change fail."""
        return self._with(writer_epoch=self.writer_epoch + 1)

    def with_closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self._with(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble_change(self, first_entry_id: int, position: int, bookie: str) -> LedgerMetadata:
        """Writer's ensemble change: a new segment from `first_entry_id` with `position` replaced; if the last
        segment starts there already (it holds no entries yet), it is changed in place."""
        last = self.segments[-1]
        if first_entry_id < last.first_entry_id:
            raise ValueError(f"ensemble change at entry {first_entry_id} precedes the last segment")
        bookies = list(last.bookies)
        bookies[position] = bookie
        kept = self.segments[:-1] if first_entry_id == last.first_entry_id else self.segments
        return self._with(segments=[*kept, Segment(first_entry_id=first_entry_id, bookies=tuple(bookies))])

    def with_replaced_bookie(self, segment_index: int, position: int, bookie: str) -> LedgerMetadata:
        """Repair's change: after copying a fragment to `bookie`, it takes `position` in that segment."""
        segments = list(self.segments)
        bookies = list(segments[segment_index].bookies)
        bookies[position] = bookie
        segments[segment_index] = Segment(first_entry_id=segments[segment_index].first_entry_id, bookies=bookies)
        return self._with(segments=segments)

    def encode(self) -> bytes:
        """The znode's bytes: BookKeeper's format 3."""
        record = LedgerMetadataFormat(
            quorumSize=self.write_quorum,
            ackQuorumSize=self.ack_quorum,
            ensembleSize=self.ensemble_size,
            length=self.length,
            lastEntryId=self.last_entry_id,
            state=self.state.value,
            ctime=round(self.ctime * 1000),
            digestType=PROTO_DIGEST_TYPES[self.digest_type.name],
            password=self.password,
            cToken=self.c_token,
        )
        custom = dict(self.custom)
        if self.writer_epoch:
            custom[WRITER_EPOCH_KEY] = str(self.writer_epoch)
        for key, value in custom.items():
            record.customMetadata.add(key=key, value=value.encode("utf-8", "surrogateescape"))
        for segment in self.segments:
            record.segment.add(firstEntryId=segment.first_entry_id, ensembleMember=segment.bookies)
        body = record.SerializeToString()
        return FORMAT_HEADER + b"%d\n" % FORMAT_VERSION + _VarintBytes(len(body)) + body

    @classmethod
    def decode(cls, data: bytes, ledger_id: int | None = None) -> LedgerMetadata:
        """A record of format 3 or 2; MetadataError names the ledger and what is wrong (bookfleet's JSON records
        from before its BookKeeper formats included)."""
        where = "ledger metadata" if ledger_id is None else f"metadata of ledger {ledger_id}"
        if data.startswith(b"{"):
            raise MetadataError(f"{where} is bookfleet's old JSON record; {OLD_FORMAT_ADVICE}")
        version, _, rest = data.removeprefix(FORMAT_HEADER).partition(b"\n")
        if not data.startswith(FORMAT_HEADER) or version not in (b"2", b"3"):
            raise MetadataError(f"{where} is not BookKeeper ledger metadata of format 2 or 3: {data[:40]!r}")
        record = LedgerMetadataFormat()
        try:
            if version == b"3":
                size, start = _DecodeVarint(rest, 0)
                if start + size > len(rest):
                    raise DecodeError(f"the record is {len(rest) - start} bytes, its length says {size}")
                record.ParseFromString(rest[start : start + size])
            else:
                text_format.Parse(rest.decode(), record)
        except (DecodeError, text_format.ParseError, UnicodeDecodeError, IndexError) as exc:
            raise MetadataError(f"{where} does not parse: {exc}") from None
        if not record.IsInitialized():
            raise MetadataError(f"{where} does not parse: it lacks {', '.join(record.FindInitializationErrors())}")
        return cls._from_record(record, where)

    @classmethod
    def _from_record(cls, record, where: str) -> LedgerMetadata:
        custom = {entry.key: entry.value.decode("utf-8", "surrogateescape") for entry in record.customMetadata}
        epoch = custom.pop(WRITER_EPOCH_KEY, "0")
        closed = record.state == LedgerMetadataFormat.CLOSED
        stated = record.HasField("password") and record.HasField("digestType")  # BookKeeper's rule as well
        digest_number = record.digestType if stated else LedgerMetadataFormat.CRC32C
        proto_digest = LedgerMetadataFormat.DigestType.Name(digest_number)
        try:
            digest = {proto: name for name, proto in PROTO_DIGEST_TYPES.items()}[proto_digest]
            return cls(
                ensemble_size=record.ensembleSize,
                write_quorum=record.quorumSize,
                ack_quorum=record.ackQuorumSize if record.HasField("ackQuorumSize") else record.quorumSize,
                state=LedgerState(LedgerMetadataFormat.State.Name(record.state)),
                last_entry_id=record.lastEntryId if closed else wire.INVALID_ENTRY_ID,
                length=record.length if closed else 0,
                segments=[Segment(first_entry_id=s.firstEntryId, bookies=tuple(s.ensembleMember))
                          for s in record.segment],
                digest_type=wire.DigestType[digest],
                password=record.password,
                ctime=record.ctime / 1000,
                custom={key: value for key, value in custom.items() if not key.startswith(BOOKFLEET_KEY_PREFIX)},
                c_token=record.cToken,
                writer_epoch=int(epoch),
            )
        except (KeyError, ValueError) as exc:
            raise MetadataError(f"{where} is not metadata bookfleet can use: {exc}") from None


def new_metadata(
    bookies: Iterable[str],
    write_quorum: int,
    ack_quorum: int,
    digest_type: wire.DigestType | str = wire.DigestType.CRC32C,
    password: bytes = b"",
    custom: dict[str, str] | None = None,
) -> LedgerMetadata:
    """Metadata of a new open ledger on `bookies` (the ensemble, in order)."""
    ensemble = tuple(bookies)
    return LedgerMetadata(
        ensemble_size=len(ensemble),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        segments=(Segment(first_entry_id=0, bookies=ensemble),),
        digest_type=wire.DigestType(digest_type),
        password=password,
        custom=custom or {},
    )


class MetadataStore:
    """Ledger metadata in ZooKeeper. Versions are znode versions; every change passes the version it read."""

    def __init__(self, zk: KazooClient):
        self.zk = zk

    def new_ledger_id(self) -> int:
        """A cluster-unique id, handed out as BookKeeper's client does, so bookfleet and Java clients share one
        counter: a sequential znode under /ledgers/idgen while its 31 bits last; once its sequence overflows,
        /ledgers/idgen-long exists for good and an id is the newest HOB level's number (high 32 bits) and a sequence
        under it (low 32 bits), a new level begun each time one runs out."""
        if self.zk.exists(zkpaths.IDGEN_LONG) is None:
            short = self._sequence(zkpaths.IDGEN_PREFIX)
            if 0 <= short < zkpaths.SHORT_ID_LIMIT:
                return short
            self.zk.ensure_path(zkpaths.IDGEN_LONG)
        while True:
            levels = [name.removeprefix(zkpaths.HIGH_BITS_PREFIX) for name in self._children(zkpaths.IDGEN_LONG)]
            high = max((int(level) for level in levels if level.isdigit()), default=0)
            if high:
                low = self._sequence(f"{zkpaths.high_bits(high)}/ID-")
                if 0 <= low < zkpaths.SHORT_ID_LIMIT:
                    return high << 32 | low
            with contextlib.suppress(NodeExistsError):
                self.zk.create(zkpaths.high_bits(high + 1))

    def _sequence(self, prefix: str) -> int:
        """The sequence number of a sequential znode made and deleted at once (the counter lives in the parent);
        negative once the parent's 32-bit counter overflowed."""
        path = self.zk.create(prefix, sequence=True, makepath=True)
        self.zk.delete(path)
        return int(path[len(prefix) :])

    def create(self, metadata: LedgerMetadata, ledger_id: int | None = None) -> int:
        """Store a new ledger's metadata (version 0); returns the ledger id."""
        ledger_id = self.new_ledger_id() if ledger_id is None else ledger_id
        self.zk.ensure_path(zkpaths.ledger(ledger_id).rsplit("/", 1)[0])
        txn = self.zk.transaction()
        self.create_in(txn, ledger_id, metadata)
        results = txn.commit()
        if isinstance(results[0], NodeExistsError):
            raise MetadataError(f"ledger {ledger_id} already exists")
        self._raise_failure(ledger_id, 0, results)
        return ledger_id

    @staticmethod
    def create_in(txn: TransactionRequest, ledger_id: int, metadata: LedgerMetadata) -> None:
        """create() as the caller's transaction, whose parents exist: a loader of many ledgers commits these
        asynchronously, many in flight, instead of one round trip after another."""
        txn.create(zkpaths.ledger(ledger_id), metadata.encode())

    def read(self, ledger_id: int, watch: Callable[[WatchedEvent], None] | None = None) -> tuple[LedgerMetadata, int]:
        """(metadata, znode version) of a ledger; `watch` is called at its next change or deletion (ZooKeeper's
        one-shot data watch, set by the same request)."""
        try:
            data, stat = self.zk.retry(self.zk.get, zkpaths.ledger(ledger_id), watch=watch)
        except NoNodeError:
            raise NoSuchLedgerError(ledger_id) from None
        return LedgerMetadata.decode(data, ledger_id), stat.version

    def read_ahead(self, ledger_id: int, watch: Callable[[WatchedEvent], None] | None = None) -> PendingRead:
        """read(), sent now and answered later: many of them are in flight together (one wait instead of one per
        ledger), each setting its watch as read() does."""
        return PendingRead(self, ledger_id, watch, self.zk.get_async(zkpaths.ledger(ledger_id), watch=watch))

    def read_all(self, ledger_ids: Iterable[int]) -> dict[int, tuple[LedgerMetadata, int] | None]:
        """read() of many ledgers in multiRead requests (read_many); None for a ledger that does not exist."""
        return {ledger_id: None if read is None else (LedgerMetadata.decode(read[0], ledger_id), read[1].version)
                for ledger_id, read in read_many(self.zk, ledger_ids, zkpaths.ledger)}

    def update(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-set: write `metadata` if the znode is still at `version` (-1: any); returns the new version."""
        stat = self.zk.retry(self.zk.exists, zkpaths.ledger(ledger_id))
        if stat is None:
            raise NoSuchLedgerError(ledger_id)
        current = stat.version
        if version not in (-1, current):
            raise MetadataVersionConflict(ledger_id, version)
        txn = self.zk.transaction()
        self.update_in(txn, ledger_id, metadata, current)
        try:
            results = txn.commit()
        except ConnectionLoss:
            return self._settle_lost_update(ledger_id, metadata, current)
        self._raise_failure(ledger_id, current, results)
        return results[0].version

    def _settle_lost_update(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """The connection went before update()'s reply came: read back whether the compare-and-set applied. It did
        if the znode holds exactly `metadata` one version on; otherwise it reports a conflict, so the caller re-reads
        and re-applies its change, as after any concurrent update (never a blind second write)."""
        data, stat = self.zk.retry(self.zk.get, zkpaths.ledger(ledger_id))
        if stat.version == version + 1 and data == metadata.encode():
            return stat.version
        raise MetadataVersionConflict(ledger_id, version)

    @staticmethod
    def update_in(txn: TransactionRequest, ledger_id: int, metadata: LedgerMetadata, version: int) -> None:
        """update() as the first operation of the caller's transaction, which fails on the version."""
        txn.set_data(zkpaths.ledger(ledger_id), metadata.encode(), version=version)

    def delete(self, ledger_id: int, version: int = -1) -> None:
        """Remove the metadata (version -1: whatever version it has)."""
        txn = self.zk.transaction()
        txn.delete(zkpaths.ledger(ledger_id), version=version)
        self._raise_failure(ledger_id, version, txn.commit())

    def ledger_ids(self) -> list[int]:
        """Every ledger id, sorted, by walking the hierarchical layout."""
        return sorted(self._walk_ids())

    def count(self) -> int:
        """How many ledgers there are, from the child counts of the levels that hold them (the stat of each): no id is
        listed, so 100,000 ledgers cost a few requests, not 100,000 names to receive, parse and sort."""
        return sum(read[1].numChildren for _, read in read_many(self.zk, self._leaf_levels(), str) if read is not None)

    def scan(self) -> dict[int, LedgerMetadata]:
        """Every ledger's metadata, read in multiRead requests; a record that does not parse is left out with a
        warning (nothing may conclude from it that a bookie holds none of that ledger: bookie GC re-reads a ledger
        before it drops a copy and keeps it when the record does not parse)."""
        found = {}
        for ledger_id, read in read_many(self.zk, self.ledger_ids(), zkpaths.ledger):
            if read is None:
                continue  # deleted since the listing
            try:
                found[ledger_id] = LedgerMetadata.decode(read[0], ledger_id)
            except MetadataError as exc:
                log.warning("left out of the scan: %s", exc)
        return found

    def ledgers_by_bookie(self) -> dict[str, list[int]]:
        """bookie id -> the ledgers whose metadata names it in any segment, by id. Built by scanning every ledger's
        metadata, as BookKeeper's auditor builds its bookie-to-ledger index: a Java client writes no index of its own,
        so no index kept beside the metadata could be trusted for the ledgers it creates."""
        index: dict[str, list[int]] = {}
        for ledger_id, metadata in self.scan().items():
            for bookie in metadata.bookies():
                index.setdefault(bookie, []).append(ledger_id)
        return index

    def ledgers_on_bookie(self, bookie_id: str) -> list[int]:
        """Ledgers that have any segment on `bookie_id` (a scan: ledgers_by_bookie)."""
        return self.ledgers_by_bookie().get(bookie_id, [])

    def bookies_with_ledgers(self) -> list[str]:
        """Bookies some ledger's metadata names (some may have left the fleet: what the auditor looks for)."""
        return sorted(self.ledgers_by_bookie())

    def _walk_ids(self) -> Iterator[int]:
        for level, leaves in read_many(self.zk, self._leaf_levels(), str, children=True):
            for leaf in leaves or ():
                if leaf.startswith("L"):
                    yield zkpaths.ledger_id_from_path(f"{level}/{leaf}")

    def _leaf_levels(self) -> list[str]:
        """The levels that hold ledger znodes, of both layouts (/ledgers/NN/NNNN and /ledgers/NNN/NNNN/NNNN/NNNN),
        each depth listed in multiRead requests; BookKeeper's and bookfleet's other nodes under /ledgers are not."""
        levels = [f"{zkpaths.ROOT}/{top}" for top in self._children(zkpaths.ROOT) if zkpaths.is_ledger_level(top)]
        leaf_levels = []
        while levels:
            below = [f"{level}/{name}" for level, names in read_many(self.zk, levels, str, children=True)
                     for name in names or () if zkpaths.is_ledger_level(name, depth=1)]
            leaf_levels += [level for level in below if zkpaths.holds_ledgers(level)]
            levels = [level for level in below if not zkpaths.holds_ledgers(level)]
        return leaf_levels

    def _children(self, path: str) -> list[str]:
        try:
            return self.zk.get_children(path)
        except NoNodeError:
            return []


    @staticmethod
    def _raise_failure(ledger_id: int, version: int, results: list) -> None:
        errors = [r for r in results if isinstance(r, Exception)]
        if not errors:
            return
        if isinstance(results[0], BadVersionError):
            raise MetadataVersionConflict(ledger_id, version)
        if isinstance(results[0], NoNodeError):
            raise NoSuchLedgerError(ledger_id)
        first = next(e for e in errors if type(e).__name__ != "RolledBackError")
        raise MetadataError(f"ledger {ledger_id}: ZooKeeper transaction failed: {type(first).__name__}")


@dataclass(frozen=True, slots=True)
class PendingRead:
    """One MetadataStore.read_ahead in flight."""

    store: MetadataStore
    ledger_id: int
    watch: Callable[[WatchedEvent], None] | None
    answer: IAsyncResult

    def get(self) -> tuple[LedgerMetadata, int]:
        """As read() answers; a read lost with its connection is made again as read() makes it (with retries)."""
        try:
            data, stat = self.answer.get()
        except NoNodeError:
            raise NoSuchLedgerError(self.ledger_id) from None
        except (ConnectionLoss, SessionExpiredError):
            return self.store.read(self.ledger_id, self.watch)
        return LedgerMetadata.decode(data, self.ledger_id), stat.version
