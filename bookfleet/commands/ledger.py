"""`bookfleet ledger ...`: create, write, read, close, recover, delete, inspect and list ledgers."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper, WrongPasswordError, check_password
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies
from bookfleet.client.reader import LedgerReader, LedgerReadError
from bookfleet.client.recovery import RecoveryError
from bookfleet.commanderror import CommandError
from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta.metadata import LedgerMetadata, MetadataError

CLEAR_ERRORS = (MetadataError, WrongPasswordError, NotEnoughBookies, LedgerWriteError, LedgerReadError, RecoveryError)
"""Errors whose message is already the one line a user needs."""


def ledger_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ledger id must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"ledger id must be a non-negative integer, got {value}")
    return value


def register(subparsers) -> None:
    parser = subparsers.add_parser("ledger", help="create, write, read, recover and inspect ledgers")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str, handler: Callable, with_id: bool = True, json_output: bool = False):
        sub = actions.add_parser(name, help=help)
        if with_id:
            sub.add_argument("ledger_id", type=ledger_id, metavar="ID")
        add_zk_argument(sub)
        if json_output:
            sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(handler=lambda args: _run(args, handler))
        return sub

    create = action("create", "create a ledger and print its id", _create, with_id=False, json_output=True)
    create.add_argument("-e", "--ensemble", type=int, default=3, help="ensemble size E (default 3)")
    create.add_argument("-w", "--write-quorum", type=int, default=3, help="write quorum Qw (default 3)")
    create.add_argument("-a", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    create.add_argument("--digest", choices=[d.value for d in wire.DigestType], default=wire.DigestType.CRC32C)
    create.add_argument("--placement", choices=["random", "zone-aware"], default="zone-aware")
    _password(create)

    write = action(
        "write", "append stdin lines (or --count generated entries) to an open ledger", _write, json_output=True
    )
    write.add_argument("--count", type=int, help="write N generated entries instead of stdin lines")
    write.add_argument("--size", type=int, default=100, help="bytes per generated entry (default 100)")
    _password(write)

    read = action("read", "print entries up to the last confirmed one", _read, json_output=True)
    read.add_argument("--from", dest="first", type=int, default=0, help="first entry id (default 0)")
    read.add_argument("--to", dest="last", type=int, help="last entry id (default: the last confirmed)")
    _password(read)

    _password(action("close", "close a ledger: fence its writer (if any), recover its tail", _close, json_output=True))
    _password(action("recover", "fence a ledger, recover its tail and close it", _recover, json_output=True))
    action("delete", "delete a ledger's metadata (bookies drop its entries at their next GC)", _delete)
    _password(
        action(
            "info",
            "print a ledger's metadata with its segments; for an open ledger also the LAC and length its bookies "
            "report (the length needs --password)",
            _info,
            json_output=True,
        )
    )
    action("list", "list ledger ids", _list, with_id=False, json_output=True)


def _password(parser) -> None:
    parser.add_argument("--password", default="", help="the ledger's password (default empty)")


def _run(args, handler: Callable[[BookKeeper, argparse.Namespace], Awaitable[object]]) -> int:
    if getattr(args, "count", None) is not None and args.count < 0:
        raise CommandError(f"--count must be >= 0, got {args.count}")
    with zk_session(args.zk, talks_to_bookies=args.action in {"write", "read", "close", "recover"}) as client:
        try:
            asyncio.run(_with_bookkeeper(client, args, handler))
        except CLEAR_ERRORS as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:  # bad E/Qw/Qa and similar
            raise CommandError(str(exc)) from None
    return 0


async def _with_bookkeeper(client, args, handler) -> None:
    async with BookKeeper(client) as bookkeeper:
        await handler(bookkeeper, args)


def _bytes(text: str) -> bytes:
    return text.encode()


def _emit(args, data: object, text: str) -> None:
    print(json.dumps(data) if getattr(args, "json", False) else text)


async def _create(bk: BookKeeper, args) -> None:
    writer = await bk.create_ledger(
        args.ensemble,
        args.write_quorum,
        args.ack_quorum,
        args.digest,
        _bytes(args.password),
        placement=args.placement,
    )
    await writer.detach()
    _emit(args, {"ledger_id": writer.ledger_id}, str(writer.ledger_id))


async def _write(bk: BookKeeper, args) -> None:
    writer = await bk.reopen_ledger(args.ledger_id, _bytes(args.password))
    if args.count is not None:
        payloads = (b"%0*d" % (args.size, i) if args.size else b"" for i in range(args.count))
    else:
        payloads = (line.rstrip(b"\n") for line in sys.stdin.buffer)
    pending = [writer.append(payload) for payload in payloads]
    entry_ids = await asyncio.gather(*pending)
    await writer.flush()
    await writer.detach()
    first, last = (entry_ids[0], entry_ids[-1]) if entry_ids else (None, None)
    _emit(
        args,
        {"ledger_id": args.ledger_id, "entries": len(entry_ids), "first_entry_id": first, "last_entry_id": last},
        f"wrote {len(entry_ids)} entries to ledger {args.ledger_id}" + (f" ({first}..{last})" if entry_ids else ""),
    )


async def _read(bk: BookKeeper, args) -> None:
    reader = await bk.open_ledger(args.ledger_id, _bytes(args.password))
    async for entry in reader.entries(args.first, args.last):
        text = entry.payload.decode(errors="backslashreplace")
        _emit(args, {"entry_id": entry.entry_id, "length": entry.length, "payload": text}, text)


async def _close(bk: BookKeeper, args) -> None:
    """Closing from outside the writer is a recovery open: it fences a writer that may still be alive, so that
    writer gets no acknowledgement past the lastEntryId recorded here."""
    _print_metadata(args, await bk.recover_ledger(args.ledger_id, _bytes(args.password)))


async def _recover(bk: BookKeeper, args) -> None:
    _print_metadata(args, await bk.recover_ledger(args.ledger_id, _bytes(args.password)))


async def _delete(bk: BookKeeper, args) -> None:
    bk.delete_ledger(args.ledger_id)
    print(f"deleted ledger {args.ledger_id}")


async def _info(bk: BookKeeper, args) -> None:
    metadata = bk.ledger_metadata(args.ledger_id)
    report = None if metadata.is_closed else await _bookies_report(bk, args.ledger_id, metadata, _bytes(args.password))
    _print_metadata(args, metadata, report)


class BookiesReport(BaseModel):
    """What the bookies of a ledger not closed yet report: its metadata's last entry and length are only set at
    close, so a reader's LAC comes from the last segment's bookies and the length from the entry at the LAC."""

    last_add_confirmed: int | None = None
    last_entry_stored: int | None = None
    """The highest entry a bookie holds: above the LAC, entries written but not (yet) acknowledged."""
    length: int | None = None
    error: str | None = None
    """Why the bookies, or the length (its entry's digest needs the password), could not be read."""


async def _bookies_report(bk: BookKeeper, ledger_id: int, metadata: LedgerMetadata, password: bytes) -> BookiesReport:
    reader = LedgerReader(ledger_id, metadata, password, bk.metadata, bk.pool)
    try:
        lac, last_stored = await reader.bookie_view()
    except LedgerReadError as exc:
        return BookiesReport(error=str(exc))
    report = BookiesReport(last_add_confirmed=lac, last_entry_stored=last_stored, length=0 if lac < 0 else None)
    if lac >= 0:
        try:
            check_password(ledger_id, metadata, password)
            report.length = (await reader.read(lac)).length
        except (WrongPasswordError, LedgerReadError) as exc:
            report.error = str(exc)
    return report


async def _list(bk: BookKeeper, args) -> None:
    ids = bk.list_ledgers()
    _emit(args, ids, "\n".join(map(str, ids)))


def _print_metadata(args, metadata: LedgerMetadata, bookies_report: BookiesReport | None = None) -> None:
    """The metadata; for a ledger not closed yet, beside it what its bookies report (`bookies_report`)."""
    head = f"ledger {args.ledger_id}: {metadata.state}"
    if metadata.is_closed:
        head += f", last entry {metadata.last_entry_id}, length {metadata.length}"
    else:
        head += " (the metadata's last entry and length are set at close)"
    lines = [
        head,
        f"  E={metadata.ensemble_size} Qw={metadata.write_quorum} Qa={metadata.ack_quorum} "
        f"digest={metadata.digest_type}",
        *(f"  from entry {s.first_entry_id}: {', '.join(s.bookies)}" for s in metadata.segments),
    ]
    if bookies_report is not None:
        lines.insert(1, _describe_report(bookies_report))
    if metadata.custom:
        lines.append(f"  custom: {json.dumps(metadata.custom)}")
    document = {"ledger_id": args.ledger_id, **metadata.model_dump(mode="json")}
    if not metadata.is_closed:
        document["bookies_report"] = bookies_report.model_dump(exclude_none=True) if bookies_report else None
    _emit(args, document, "\n".join(lines))


def _describe_report(report: BookiesReport) -> str:
    if report.last_add_confirmed is None:
        return f"  bookies report: nothing ({report.error})"
    length = "unknown" if report.length is None else report.length
    line = f"  bookies report: last confirmed entry {report.last_add_confirmed}, length {length}"
    if report.last_entry_stored is not None and report.last_entry_stored > report.last_add_confirmed:
        line += f"; entries up to {report.last_entry_stored} stored but not confirmed"
    if report.error:
        line += f" ({report.error})"
    return line
