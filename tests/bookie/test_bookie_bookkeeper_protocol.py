"""A real bookie process spoken to in Apache BookKeeper's protocol, V2 and V3, frame by frame: every served
operation, BookKeeper's status codes, the per-connection choice beside bookfleet's own frames, and hostile frames
that cost only their own connection."""

from __future__ import annotations

import asyncio
import os

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import BookieInfoWanted, OperationType, ReadFlag, StatusCode
from bookfleet.bkwire import V2Flag, V2Op, V2Status
from bookfleet.client.connection import BookieClient
from tests.fixtures.bkclient import (
    MASTER_KEY,
    BkConnection,
    V2Answer,
    bk_entry,
    v2_add,
    v2_batch_read,
    v2_read,
    v3_request,
)
from tests.fixtures.bookies import encode_test_entry

OTHER_KEY = b"\x01" * bkwire.MASTER_KEY_SIZE


def unserved_request(operation: int, txn_id: int):
    """A V3 request of an operation this bookie does not serve (BATCH_READ_ENTRY is 12)."""
    request = bkprotocol.Request()
    request.header.version, request.header.operation, request.header.txnId = 3, operation, txn_id
    return request


async def test_v2_adds_reads_fences_and_recovers(bookie_fleet):
    (bookie,) = bookie_fleet.start(1)
    conn = await BkConnection.open(bookie.port)
    entries = [bk_entry(3, i, os.urandom(50 + i)) for i in range(6)]
    await conn.send(*(v2_add(entry) for entry in entries))  # pipelined; answers matched by (ledger, entry)
    acks = [(a.op, a.rc, a.ledger_id, a.entry_id) for a in [await conn.v2() for _ in entries]]
    assert sorted(acks) == [(V2Op.ADD, V2Status.EOK, 3, i) for i in range(6)]

    read = await conn.v2(v2_read(3, 4))
    assert (read.op, read.rc, read.entry_id, read.body) == (V2Op.READ, V2Status.EOK, 4, entries[4])
    last = await conn.v2(v2_read(3, -1))  # entry -1: the last entry stored here, answered as -1
    assert (last.rc, last.entry_id, last.body) == (V2Status.EOK, -1, entries[5])
    assert (await conn.v2(v2_read(3, 9))).rc == V2Status.ENOENTRY
    assert (await conn.v2(v2_read(99, 0))).rc == V2Status.ENOLEDGER
    assert (await conn.v2(v2_add(bk_entry(3, 6, b"x"), key=OTHER_KEY))).rc == V2Status.EUA

    batch = await conn.v2(v2_batch_read(3, 1, request_id=77, max_count=3, max_size=1 << 20))
    assert (batch.op, batch.rc, batch.ledger_id, batch.entry_id) == (V2Op.BATCH_READ, V2Status.EOK, 3, 1)
    assert bkwire.decode_v2_batch_entries(batch.body) == (77, entries[1:4])
    to_the_end = await conn.v2(v2_batch_read(3, 4, request_id=78, max_count=0, max_size=1 << 20))
    assert bkwire.decode_v2_batch_entries(to_the_end.body) == (78, entries[4:])
    one = await conn.v2(v2_batch_read(3, 0, request_id=79, max_count=5, max_size=1))  # always the first one
    assert bkwire.decode_v2_batch_entries(one.body) == (79, entries[:1])
    missing = await conn.v2(v2_batch_read(3, 6, request_id=80, max_count=5, max_size=1 << 20))
    assert (missing.rc, bkwire.decode_v2_batch_entries(missing.body)) == (V2Status.ENOENTRY, (80, []))

    fenced = await conn.v2(v2_read(3, -1, V2Flag.FENCE, MASTER_KEY))
    assert (fenced.rc, fenced.body) == (V2Status.EOK, entries[5])
    assert (await conn.v2(v2_add(bk_entry(3, 6, b"late")))).rc == V2Status.EFENCED
    recovered = bk_entry(3, 6, b"recovery")
    assert (await conn.v2(v2_add(recovered, V2Flag.RECOVERY_ADD | V2Flag.HIGH_PRIORITY))).rc == V2Status.EOK
    assert (await conn.v2(v2_read(3, 6))).body == recovered
    assert (await conn.v2(v2_read(3, 0, V2Flag.FENCE, OTHER_KEY))).rc == V2Status.EUA

    auth = bkwire.decode_auth_message((await conn.raw(bkwire.encode_v2_request(V2Op.AUTH, 0, b"")))[4:])
    assert auth.authPluginName == bkwire.AUTH_DISABLED_PLUGIN
    await conn.close()


async def test_v3_serves_every_operation_with_its_txn_id(bookie_fleet):
    (bookie,) = bookie_fleet.start(1)
    conn = await BkConnection.open(bookie.port)
    entries = [bk_entry(8, i, os.urandom(40)) for i in range(4)]
    for i, entry in enumerate(entries):
        answer = await conn.v3(v3_request(OperationType.ADD_ENTRY, 100 + i, ledgerId=8, entryId=i,
                                          masterKey=MASTER_KEY, body=entry))
        assert (answer.header.txnId, answer.status, answer.addResponse.entryId) == (100 + i, StatusCode.EOK, i)

    read = await conn.v3(v3_request(OperationType.READ_ENTRY, 7, ledgerId=8, entryId=2))
    assert (read.header.operation, read.status, read.readResponse.body) == (OperationType.READ_ENTRY, 0, entries[2])
    assert read.readResponse.maxLAC == 2  # the LAC the entries carry: entry 3 says 2
    last = await conn.v3(v3_request(OperationType.READ_ENTRY, 8, ledgerId=8, entryId=-1))
    assert (last.readResponse.entryId, last.readResponse.body) == (-1, entries[3])
    lac = await conn.v3(v3_request(OperationType.READ_LAC, 9, ledgerId=8))
    assert (lac.status, lac.readLacResponse.lastEntryBody) == (StatusCode.EOK, entries[3])
    nothing = await conn.v3(v3_request(OperationType.READ_ENTRY, 10, ledgerId=8, entryId=9))
    assert (nothing.status, nothing.readResponse.status, nothing.readResponse.entryId) == (403, 403, 9)
    assert (await conn.v3(v3_request(OperationType.READ_LAC, 11, ledgerId=55))).status == StatusCode.ENOLEDGER

    write_lac = await conn.v3(v3_request(OperationType.WRITE_LAC, 12, ledgerId=8, lac=3, masterKey=MASTER_KEY,
                                         body=b"ledger, lac and digest"))
    assert (write_lac.status, write_lac.writeLacResponse.ledgerId) == (StatusCode.EOK, 8)
    assert (await conn.v3(v3_request(OperationType.FORCE_LEDGER, 13, ledgerId=8))).forceLedgerResponse.ledgerId == 8
    wanted = BookieInfoWanted.FREE_DISK_SPACE | BookieInfoWanted.TOTAL_DISK_CAPACITY
    info = (await conn.v3(v3_request(OperationType.GET_BOOKIE_INFO, 14, requested=wanted))).getBookieInfoResponse
    assert 0 < info.freeDiskSpace <= info.totalDiskCapacity
    auth = await conn.v3(v3_request(OperationType.AUTH, 15, authPluginName="any", payload=b""))
    assert (auth.status, auth.authResponse.authPluginName) == (StatusCode.EOK, bkwire.AUTH_DISABLED_PLUGIN)
    assert (await conn.v3(v3_request(OperationType.START_TLS, 16))).status == StatusCode.EBADREQ

    # Long poll with the entry piggybacked: the LAC (3, written above) is past 2, so entry 3 comes along.
    poll = await conn.v3(v3_request(OperationType.READ_ENTRY, 17, ledgerId=8, entryId=-1, previousLAC=2,
                                    timeOut=5000, flag=ReadFlag.ENTRY_PIGGYBACK))
    assert (poll.readResponse.entryId, poll.readResponse.maxLAC, poll.readResponse.body) == (3, 3, entries[3])
    waiting = asyncio.create_task(conn.v3(v3_request(OperationType.READ_ENTRY, 18, ledgerId=8, entryId=-1,
                                                     previousLAC=3, timeOut=30000, flag=ReadFlag.ENTRY_PIGGYBACK)))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    other = await BkConnection.open(bookie.port)
    newer = bk_entry(8, 4, b"wakes the poll", lac=3)
    await other.v3(v3_request(OperationType.ADD_ENTRY, 1, ledgerId=8, entryId=4, masterKey=MASTER_KEY, body=newer))
    newest = bk_entry(8, 5, b"carries lac 4", lac=4)
    await other.v3(v3_request(OperationType.ADD_ENTRY, 2, ledgerId=8, entryId=5, masterKey=MASTER_KEY, body=newest))
    woken = (await asyncio.wait_for(waiting, 30)).readResponse
    assert (woken.entryId, woken.body) == (4, newer)

    fence = await conn.v3(v3_request(OperationType.READ_ENTRY, 19, ledgerId=8, entryId=-1,
                                     flag=ReadFlag.FENCE_LEDGER, masterKey=MASTER_KEY))
    assert (fence.status, fence.readResponse.body) == (StatusCode.EOK, newest)
    late = await other.v3(v3_request(OperationType.ADD_ENTRY, 3, ledgerId=8, entryId=6, masterKey=MASTER_KEY,
                                     body=bk_entry(8, 6, b"late")))
    assert (late.status, late.addResponse.status, late.addResponse.entryId) == (504, 504, 6)
    recovery = await other.v3(v3_request(OperationType.ADD_ENTRY, 4, ledgerId=8, entryId=6, masterKey=MASTER_KEY,
                                         body=bk_entry(8, 6, b"recovery"), flag=1))
    assert recovery.status == StatusCode.EOK
    await conn.close()
    await other.close()


async def test_protocols_are_told_apart_per_connection(bookie_fleet):
    """bookfleet's own frames, V2 and V3 on connections of the same bookie, on the same ledger."""
    (bookie,) = bookie_fleet.start(1)
    key = wire.master_key(b"shared")  # BookKeeper's key: the bookie keeps whatever key the first add brings
    async with await BookieClient.connect(bookie.address) as client:
        await client.add_entry(key, encode_test_entry(4, 0, b"bookfleet"))
    v2, v3 = await BkConnection.open(bookie.port), await BkConnection.open(bookie.port)
    assert (await v2.v2(v2_read(4, 0))).body == encode_test_entry(4, 0, b"bookfleet")
    assert (await v3.v3(v3_request(OperationType.READ_ENTRY, 1, ledgerId=4, entryId=0))).readResponse.body == (
        encode_test_entry(4, 0, b"bookfleet")
    )
    await v2.close()
    await v3.close()


async def test_hostile_bookkeeper_frames_cost_only_their_connection(bookie_fleet):
    (bookie,) = bookie_fleet.start(1)
    steady = await BkConnection.open(bookie.port)
    assert (await steady.v2(v2_add(bk_entry(5, 0, b"steady")))).rc == V2Status.EOK

    # Fields out of range are refused EBADREQ, with the request's ids, and the connection goes on.
    refused = {
        "negative ledger": (v2_read(-5, 0), -5),
        "entry -2": (v2_read(5, -2), 5),
        "batch from -1": (v2_batch_read(5, -1, 1, 1, 100), 5),
        "entry header ledger": (v2_add(bk_entry(2**63, 0, b"x")), -(2**63)),
        "entry header lac": (v2_add(bk_entry(5, 1, b"x", lac=-7)), 5),
    }
    for name, (frame, ledger_id) in refused.items():
        answer = await steady.v2(frame)
        assert (answer.rc, answer.ledger_id) == (V2Status.EBADREQ, ledger_id), name
    v3 = await BkConnection.open(bookie.port)
    bad_v3 = {
        "no fields": v3_request(OperationType.READ_LAC, 1),
        "short key": v3_request(OperationType.ADD_ENTRY, 2, ledgerId=5, entryId=1, masterKey=b"k",
                                body=bk_entry(5, 1, b"x")),
        "ids differ": v3_request(OperationType.ADD_ENTRY, 3, ledgerId=5, entryId=2, masterKey=MASTER_KEY,
                                 body=bk_entry(5, 1, b"x")),
        "unknown op": bkwire.encode_v3(unserved_request(12, 4)),
        "negative timeout": v3_request(OperationType.READ_ENTRY, 5, ledgerId=5, entryId=0, previousLAC=0,
                                       timeOut=-1),
    }
    for txn_id, (name, frame) in enumerate(bad_v3.items(), 1):
        answer = await v3.v3(frame)
        assert (answer.header.txnId, answer.status) == (txn_id, StatusCode.EBADREQ), name

    # Frames that cannot be read end their own connection, with no answer.
    unreadable = {
        "v2 unknown op": bkwire.encode_v2_request(9, 0, b"\0" * 16),
        "v2 READ_LAC": bkwire.encode_v2_request(V2Op.READ_LAC, 0, b"\0" * 16),
        "v2 short add": bkwire.encode_v2_request(V2Op.ADD, 0, b"\0" * 40),
        "v2 fence without key": v2_read(5, 0, V2Flag.FENCE),
        "v2 huge length": b"\x7f\xff\xff\xff\x02\x00\x00\x00",
        "v3 garbage": b"\x00\x00\x00\x05\x0a\xff\xff\xff\xff",
        "v3 no txnId": b"\x00\x00\x00\x06\x0a\x04\x08\x03\x10\x01",
    }
    for name, payload in unreadable.items():
        conn = await BkConnection.open(bookie.port)
        await conn.send(payload)
        assert await conn.frame() is None, name
    assert (await steady.v2(v2_read(5, 0))).body == bk_entry(5, 0, b"steady")
    assert (await v3.v3(v3_request(OperationType.READ_ENTRY, 9, ledgerId=5, entryId=0))).status == StatusCode.EOK
    assert bookie.running and "Traceback" not in bookie.log_path.read_text()


async def test_the_adds_of_one_read_are_applied_together_and_answered_add_by_add(bookie_fleet):
    """Adds that arrive in one read are applied as runs of one writer, but each is judged as if alone: in one write,
    adds to a live ledger, to a fenced one, with a wrong key, a stale writer's, recovery adds of an older writer that
    fill in or would replace, and reads of what an add just before them in the same write stored."""
    (bookie,) = bookie_fleet.start(1)
    v2 = await BkConnection.open(bookie.port)
    assert (await v2.v2(v2_add(bk_entry(4, 0, b"fenced soon")))).rc == V2Status.EOK
    assert (await v2.v2(v2_read(4, -1, V2Flag.FENCE, MASTER_KEY))).rc == V2Status.EOK
    frames = [
        v2_add(bk_entry(3, 0, b"a")), v2_add(bk_entry(3, 1, b"b")), v2_add(bk_entry(4, 1, b"late")),
        v2_add(bk_entry(3, 2, b"c")), v2_add(bk_entry(3, 3, b"bad key"), key=OTHER_KEY), v2_add(bk_entry(3, 4, b"d")),
        v2_read(3, 4), v2_add(bk_entry(4, 1, b"recovered"), V2Flag.RECOVERY_ADD),
    ]
    await v2.send(*frames)
    answers = [await v2.frame() for _ in frames]
    v2_answers = sorted((a.op, a.ledger_id, a.entry_id, a.rc) for a in map(V2Answer, answers))
    assert v2_answers == [
        (V2Op.ADD, 3, 0, V2Status.EOK), (V2Op.ADD, 3, 1, V2Status.EOK), (V2Op.ADD, 3, 2, V2Status.EOK),
        (V2Op.ADD, 3, 3, V2Status.EUA), (V2Op.ADD, 3, 4, V2Status.EOK),
        (V2Op.ADD, 4, 1, V2Status.EOK), (V2Op.ADD, 4, 1, V2Status.EFENCED),
        (V2Op.READ, 3, 4, V2Status.EOK),
    ]
    assert next(a for a in map(V2Answer, answers) if a.op == V2Op.READ).body == bk_entry(3, 4, b"d")
    assert (await v2.v2(v2_read(4, 1))).body == bk_entry(4, 1, b"recovered")
    await v2.close()

    v3 = await BkConnection.open(bookie.port)
    newer, older = bkwire.AddRequestEncoder(5, MASTER_KEY, 2), bkwire.AddRequestEncoder(5, MASTER_KEY, 1)
    recovering = bkwire.AddRequestEncoder(5, MASTER_KEY, 1, recovery=True)
    frames = [
        newer.frame(bkwire.varint(1), bk_entry(5, 0, b"a")), newer.frame(bkwire.varint(2), bk_entry(5, 1, b"b")),
        older.frame(bkwire.varint(3), bk_entry(5, 2, b"stale")),
        recovering.frame(bkwire.varint(4), bk_entry(5, 1, b"b")),  # the same copy again: taken
        recovering.frame(bkwire.varint(5), bk_entry(5, 0, b"other")),  # would replace the newer writer's: refused
        recovering.frame(bkwire.varint(6), bk_entry(5, 2, b"filled in")),
        v3_request(OperationType.READ_ENTRY, 7, ledgerId=5, entryId=2),
    ]
    await v3.send(*frames)
    responses = [bkprotocol.Response.FromString(await v3.frame()) for _ in frames]
    statuses = {r.header.txnId: r.status for r in responses}
    assert statuses == {1: StatusCode.EOK, 2: StatusCode.EOK, 3: StatusCode.EFENCED, 4: StatusCode.EOK,
                        5: StatusCode.EFENCED, 6: StatusCode.EOK, 7: StatusCode.EOK}
    assert next(r for r in responses if r.header.txnId == 7).readResponse.body == bk_entry(5, 2, b"filled in")
    await v3.close()
