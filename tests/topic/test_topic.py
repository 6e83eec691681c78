"""Topics on real bookies: rollover, MessageId order across ledgers, consuming from a MessageId, producer crash."""

import asyncio
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerWriteError
from bookfleet.meta.metadata import LedgerState
from bookfleet.topic.consumer import consume
from bookfleet.topic.messageid import MessageId
from bookfleet.topic.partition import Partition, Topic
from bookfleet.topic.producer import PartitionProducer, Producer, ProducerSettings

SMALL = ProducerSettings(ensemble_size=3, write_quorum=2, ack_quorum=2)


async def produce(bk, topic, messages, **settings):
    async with Producer(bk, topic, settings=replace(SMALL, **settings)) as producer:
        futures = [producer.send(m) for m in messages]
        await producer.flush()
        return [f.result() for f in futures]


async def consumed(bk, partition, start=None, inclusive=True):
    return [item async for item in consume(bk, partition, start, inclusive)]


@pytest.fixture
def bookies(bookie_fleet):
    return bookie_fleet.start(3)


async def test_rollover_by_entries_orders_ids_across_ledgers_and_consumes_from_any_id(zk, bookies):
    messages = [f"m{n}".encode() for n in range(10)]
    async with BookKeeper(zk) as bk:
        ids = await produce(bk, "orders", messages, max_entries=4)
        partition = Partition(zk, "orders", -1)
        ledgers, _ = partition.read()
        assert [(info.closed, info.last_entry_id) for info in ledgers] == [(True, 3), (True, 3), (True, 1)]
        assert [i.ledger_id for i in ids] == [ledgers[n // 4].ledger_id for n in range(10)]
        assert ids == sorted(ids) and len(set(ids)) == 10
        assert all(i.partition == -1 and i.batch_index == -1 for i in ids)

        assert await consumed(bk, partition) == list(zip(ids, messages, strict=True))
        boundary = ids[3]  # last entry of the first ledger
        assert [m for _, m in await consumed(bk, partition, boundary)] == messages[3:]
        assert [m for _, m in await consumed(bk, partition, boundary, inclusive=False)] == messages[4:]
        assert [m for _, m in await consumed(bk, partition, ids[-1], inclusive=False)] == []


async def test_rollover_by_bytes_with_batches_on_partitions(zk, bookies):
    messages = [bytes([65 + n % 26]) * 100 for n in range(24)]
    async with BookKeeper(zk) as bk:
        settings = replace(SMALL, batch_size=3, max_bytes=500)
        async with Producer(bk, "clicks", partitions=2, settings=settings) as producer:
            futures = [producer.send(m) for m in messages]
            await producer.flush()
        ids = [f.result() for f in futures]
        for index in (0, 1):
            partition = Partition(zk, "clicks", index)
            ledgers, _ = partition.read()
            # 12 messages each: 4 batches of 3 x 100 bytes (~320 bytes), so a ledger is full after 2 entries
            assert [info.last_entry_id for info in ledgers] == [1, 1]
            assert all(info.bytes >= 500 for info in ledgers)
            mine = [(i, m) for i, m in zip(ids, messages, strict=True) if i.partition == index]
            assert sorted(mine) == mine and len(mine) == 12  # round robin: half each
            assert {i.batch_index for i, _ in mine} == {0, 1, 2}
            assert await consumed(bk, partition) == mine
            middle = mine[4][0]  # batch index 1 of the second entry
            assert await consumed(bk, partition, middle) == mine[4:]
            assert await consumed(bk, partition, middle, inclusive=False) == mine[5:]

        async with Producer(bk, "clicks", settings=SMALL) as keyed:  # the topic keeps its 2 partitions
            futures = [keyed.send(f"click {n}".encode(), key=b"user-7") for n in range(4)]
            await keyed.flush()
        assert len({f.result().partition for f in futures}) == 1  # one key, one partition, in order
        assert [f.result() for f in futures] == sorted(f.result() for f in futures)


async def test_restarted_producer_fences_the_open_ledger_and_continues(zk, bookies):
    async with BookKeeper(zk) as bk:
        await asyncio.to_thread(Topic(zk, "audit").create, 0)
        partition = Partition(zk, "audit", -1)
        crashed = await PartitionProducer(bk, partition, SMALL).start()  # never closed: it "crashed"
        acked = [await crashed.write([f"old{n}".encode()], batched=False) for n in range(5)]
        old_ledger = crashed.ledger_id

        restarted = await PartitionProducer(bk, partition, SMALL).start()
        metadata = bk.ledger_metadata(old_ledger)
        assert metadata.state == LedgerState.CLOSED and metadata.last_entry_id == 4
        with pytest.raises(LedgerWriteError):
            await crashed.write([b"too late"], batched=False)  # fenced: the old producer cannot add any more
        fresh = [await restarted.write([f"new{n}".encode()], batched=False) for n in range(3)]
        await restarted.close()

        assert restarted.ledger_id is None and fresh[0][0].ledger_id > old_ledger
        got = await consumed(bk, partition)
        assert [i for i, _ in got] == [ids[0] for ids in acked + fresh]
        assert [m for _, m in got] == [f"old{n}".encode() for n in range(5)] + [f"new{n}".encode() for n in range(3)]


def test_cli_producer_killed_mid_stream_loses_no_acked_message(zk_connect, bookies):
    env = {**os.environ, "BOOKFLEET_ZK": zk_connect}
    command = [sys.executable, "-m", "bookfleet", "topic", "produce", "jobs", "--partitions", "2"]
    producer = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    acked = []
    for n in range(6):
        producer.stdin.write(f"job{n}\n")
        producer.stdin.flush()
        acked.append((MessageId.parse(producer.stdout.readline().split("\t")[0]), f"job{n}"))
    producer.kill()  # no close: both partitions' ledgers stay open
    producer.wait()

    again = subprocess.run(command, env=env, input="late0\nlate1\n", capture_output=True, text=True, check=True)
    late = [(MessageId.parse(line.split("\t")[0]), line.split("\t")[1]) for line in again.stdout.splitlines()]
    assert [m for _, m in late] == ["late0", "late1"]
    assert min(i.ledger_id for i, _ in late) > max(i.ledger_id for i, _ in acked)

    out = subprocess.run(
        [sys.executable, "-m", "bookfleet", "topic", "consume", "jobs"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    got = [(MessageId.parse(i), m) for i, m in (line.split("\t", 1) for line in out.stdout.splitlines())]
    assert sorted(got) == sorted(acked + late)
    for index in (0, 1):
        in_partition = [item for item in got if item[0].partition == index]
        assert in_partition == sorted(in_partition)

    for args, complaint in [
        (["nosuch"], "topic 'nosuch' does not exist"),
        (["jobs", "--from", "1:2:3"], "has 3 part(s)"),
        (["jobs", "--partition", "5"], "topic 'jobs' has no partition 5"),
    ]:
        bad = subprocess.run(
            [sys.executable, "-m", "bookfleet", "topic", "consume", *args], env=env, capture_output=True, text=True
        )
        assert bad.returncode == 2 and complaint in bad.stderr, bad.stderr


async def test_producer_rolls_to_a_new_ledger_when_its_ledger_is_fenced_under_it(zk, bookies):
    """A recovery open (what a repair or `bookfleet ledger close` does) fences the producer's ledger mid-stream:
    every message is still acknowledged exactly once, in the closed ledger's recovered prefix or in a new ledger."""
    messages = [b"m%d" % n for n in range(400)]
    async with BookKeeper(zk) as bk, BookKeeper(zk) as fencer:
        async with Producer(bk, "fenced", settings=SMALL) as producer:
            first = [producer.send(m) for m in messages[:200]]
            await asyncio.gather(*first[:50])
            fenced_ledger = Partition(zk, "fenced", -1).read()[0][-1].ledger_id
            closed = await fencer.recover_ledger(fenced_ledger)  # while the first 200 are still being written
            second = [producer.send(m) for m in messages[200:]]
            ids = await asyncio.gather(*first, *second)
        ledgers, _ = Partition(zk, "fenced", -1).read()
        assert len(ledgers) == 2 and ledgers[0].ledger_id == fenced_ledger
        assert (ledgers[0].closed, ledgers[0].last_entry_id) == (True, closed.last_entry_id)
        assert len(set(ids)) == len(messages) and ids == sorted(ids)
        assert sorted(await consumed(bk, Partition(zk, "fenced", -1))) == sorted(zip(ids, messages, strict=True))
