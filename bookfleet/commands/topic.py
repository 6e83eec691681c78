"""`bookfleet topic produce|consume`: stdin lines in as messages, `MessageId<TAB>message` lines out."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.client import KazooClient

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies
from bookfleet.client.reader import LedgerReadError
from bookfleet.commanderror import CommandError
from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta.metadata import MetadataError
from bookfleet.topic.consumer import consume
from bookfleet.topic.messageid import BadMessageId, MessageId
from bookfleet.topic.partition import Partition, Topic, TopicError
from bookfleet.topic.producer import Producer, ProducerSettings

DEFAULTS = ProducerSettings()
_CLEAR_ERRORS = (TopicError, BadMessageId, NotEnoughBookies, MetadataError, LedgerWriteError, LedgerReadError)


def register(subparsers) -> None:
    parser = subparsers.add_parser("topic", help="produce to and consume from partitioned topics")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    produce = actions.add_parser("produce", help="send stdin lines as messages; print their MessageIds")
    produce.add_argument("topic")
    produce.add_argument("--partitions", type=int, help="partition count of a new topic (default: non-partitioned)")
    produce.add_argument("--batch", type=int, default=1, help="messages per entry (default 1: unbatched)")
    produce.add_argument("--key-separator", help="route by the part of each line before this separator")
    produce.add_argument("--max-entries", type=int, default=DEFAULTS.max_entries, help="rollover after N")
    produce.add_argument("--max-bytes", type=int, default=DEFAULTS.max_bytes, help="rollover after B bytes")
    produce.add_argument("--max-age", type=float, default=DEFAULTS.max_age, help="rollover after S seconds")
    produce.add_argument("-e", "--ensemble", type=int, default=DEFAULTS.ensemble_size)
    produce.add_argument("-w", "--write-quorum", type=int, default=DEFAULTS.write_quorum)
    produce.add_argument("-a", "--ack-quorum", type=int, default=DEFAULTS.ack_quorum)
    add_zk_argument(produce)
    produce.set_defaults(handler=run_produce)

    consume_parser = actions.add_parser("consume", help="print `MessageId<TAB>message` for stored messages")
    consume_parser.add_argument("topic")
    consume_parser.add_argument("--from", dest="start", help="start at this MessageId (inclusive)")
    consume_parser.add_argument("--exclusive", action="store_true", help="start after --from instead of at it")
    consume_parser.add_argument("--partition", type=int, help="only this partition (default: --from's, else all)")
    add_zk_argument(consume_parser)
    consume_parser.set_defaults(handler=run_consume)


def run_produce(args) -> int:
    try:
        settings = ProducerSettings(
            max_entries=args.max_entries,
            max_bytes=args.max_bytes,
            max_age=args.max_age,
            batch_size=args.batch,
            ensemble_size=args.ensemble,
            write_quorum=args.write_quorum,
            ack_quorum=args.ack_quorum,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    with zk_session(args.zk, talks_to_bookies=True) as zk, _clear_errors():
        asyncio.run(_produce(zk, args.topic, args.partitions, settings, args.key_separator))
    return 0


async def _produce(
    zk: KazooClient, topic: str, partitions: int | None, settings: ProducerSettings, separator: str | None
) -> None:
    printed: asyncio.Queue = asyncio.Queue()

    async def print_in_order() -> None:
        while (item := await printed.get()) is not None:
            future, line = item
            print(f"{await future}\t{line}", flush=True)

    async with BookKeeper(zk) as bk, Producer(bk, topic, partitions, settings) as producer:
        printer = asyncio.ensure_future(print_in_order())
        try:
            while line := await asyncio.to_thread(sys.stdin.readline):
                line = line.rstrip("\n")
                key = line.split(separator, 1)[0].encode() if separator and separator in line else None
                printed.put_nowait((producer.send(line.encode(), key), line))
            await producer.flush()
            printed.put_nowait(None)
            await printer
        finally:
            printer.cancel()


def run_consume(args) -> int:
    with zk_session(args.zk, talks_to_bookies=True) as zk, _clear_errors():
        start = MessageId.parse(args.start) if args.start else None
        topic = Topic(zk, args.topic)
        partitions = topic.partitions()
        wanted = args.partition if args.partition is not None else start.partition if start else None
        if start is not None and wanted != start.partition:
            raise CommandError(f"--from {start} is in partition {start.partition}, not {wanted}")
        if wanted is not None:
            partitions = [p for p in partitions if p.index == wanted]
            if not partitions:
                raise CommandError(f"topic {args.topic!r} has no partition {wanted}")
        asyncio.run(_consume(zk, partitions, start, not args.exclusive))
    return 0


async def _consume(zk: KazooClient, partitions: list[Partition], start: MessageId | None, inclusive: bool) -> None:
    async with BookKeeper(zk) as bk:
        for partition in partitions:
            async for message_id, message in consume(bk, partition, start, inclusive):
                print(f"{message_id}\t{message.decode(errors='backslashreplace')}")
    sys.stdout.flush()


@contextmanager
def _clear_errors() -> Iterator[None]:
    try:
        yield
    except _CLEAR_ERRORS as exc:
        raise CommandError(str(exc)) from None
