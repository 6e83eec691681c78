"""Errors of the bookie, each carrying the wire status the server answers with, so mapping lives in one place."""

from __future__ import annotations

from bookfleet.wire import Status


class StatusError(Exception):
    """A request the bookie refuses; `status` is what goes on the wire, the message says why."""

    status: Status = Status.INTERNAL_ERROR


class NoSuchLedger(StatusError):
    status = Status.NO_SUCH_LEDGER

    def __init__(self, ledger_id: int):
        super().__init__(f"ledger {ledger_id} is not on this bookie")


class NoSuchEntry(StatusError):
    status = Status.NO_SUCH_ENTRY

    def __init__(self, ledger_id: int, entry_id: int):
        super().__init__(f"ledger {ledger_id} has no entry {entry_id} on this bookie")


class CannotVouch(StatusError):
    """What the bookie lacks once its journal lost synced records: the lost span may have held it, so "no such ledger
    or entry" would pass an acknowledged entry off as one never written (recovery and repair count that answer)."""

    status = Status.UNKNOWN_LEDGER_STATE

    def __init__(self, ledger_id: int, entry_id: int | None, damage: str):
        what = f"ledger {ledger_id}" + ("" if entry_id is None else f" entry {entry_id}")
        super().__init__(
            f"this bookie cannot vouch for {what}: its journal lost synced records, which may have held it ({damage})"
        )


class LedgerFenced(StatusError):
    status = Status.FENCED

    def __init__(self, ledger_id: int):
        super().__init__(f"ledger {ledger_id} is fenced: only recovery adds are accepted")


class StaleWriterEpoch(StatusError):
    """An add (or epoch raise) from a writer whose epoch is older than one this bookie has seen: another writer
    reopened the ledger since, and this one must stop."""

    status = Status.FENCED

    def __init__(self, ledger_id: int, epoch: int, known: int):
        super().__init__(
            f"ledger {ledger_id} was reopened by another writer: writer epoch {epoch} is older than {known}"
        )


class Unauthorized(StatusError):
    status = Status.UNAUTHORIZED

    def __init__(self, ledger_id: int):
        super().__init__(f"master key does not match the one ledger {ledger_id} was created with")


class UnknownLedger(StatusError):
    """A first add, fence or LAC write of a ledger that has no metadata in ZooKeeper: nobody may claim its id."""

    status = Status.NO_SUCH_LEDGER

    def __init__(self, ledger_id: int):
        super().__init__(
            f"ledger {ledger_id} has no metadata in ZooKeeper; this bookie only creates ledgers that exist"
        )


class RoleForbidden(StatusError):
    """The peer's certificate lacks the role the request needs (the message names principal and role)."""

    status = Status.UNAUTHORIZED


class BadRequest(StatusError):
    """Input that cannot be valid whatever the bookie's state (the message names the field)."""

    status = Status.BAD_REQUEST


class ReadOnly(StatusError):
    status = Status.READ_ONLY


class ShuttingDown(StatusError):
    status = Status.SHUTTING_DOWN


class StorageFailure(StatusError):
    """The disk failed under the journal or the entry log; nothing more is acknowledged."""

    status = Status.INTERNAL_ERROR
