"""The run `make pulsar-demo` and test_pulsar_broker.py share: Pulsar's own Python client produces to a partitioned
topic while one bookie of a current ledger's ensemble is killed -9 (a third in) and then the broker is (two thirds
in, restarted at once), the topic is unloaded (the broker closes its ledgers), auto-recovery repairs every ledger
that named the lost bookie, the topic is loaded again and consumed back partition by partition, and each message
is looked for in the ledger entry bookfleet's client reads at its MessageId."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pulsar

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from tests.pulsar.broker import PulsarBroker

NAMESPACE = "public/default"
PAYLOAD_SIZE = 100
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def payload(topic: str, seq: int) -> bytes:
    """Unique per message and run, so finding it inside an entry (a batch) says which message it is."""
    return f"{topic}:{seq:09d}:".encode().ljust(PAYLOAD_SIZE, b".")


@dataclass
class Acked:
    """A message the broker acknowledged: where it says the message is stored, and how long the ack took."""

    seq: int
    partition: int
    ledger_id: int
    entry_id: int
    sent_at: float
    acked_at: float

    @property
    def latency(self) -> float:
        return self.acked_at - self.sent_at


@dataclass
class Produced:
    acked: dict[int, Acked] = field(default_factory=dict)
    failed: int = 0
    began: float = 0.0
    ended: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def last_acked(self) -> Acked:
        """The latest acknowledged message (waiting for the first acknowledgement): it names a current ledger."""
        wait_for(lambda: self.acked, timeout=60, what="the broker to acknowledge a message")
        with self.lock:
            return self.acked[max(self.acked)]


def produce(client: pulsar.Client, topic: str, seqs: Iterable[int], faults: dict[int, Callable[[Produced], None]],
            produced: Produced | None = None) -> Produced:
    """Send a message for each of `seqs` asynchronously (batching on, the Java client's default; no send timeout, so
    messages in flight wait for a restarted broker and are sent again), calling `faults[seq]` just before sending
    `seq`; into `produced` when given (a caller watching the acknowledgements while this runs)."""
    produced = produced or Produced()
    producer = client.create_producer(
        f"persistent://{NAMESPACE}/{topic}", batching_enabled=True, block_if_queue_full=True, send_timeout_millis=0,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )

    def sent(seq: int, started: float):
        def callback(result, message_id) -> None:
            with produced.lock:
                if result != pulsar.Result.Ok:
                    produced.failed += 1
                    return
                produced.acked[seq] = Acked(seq, message_id.partition(), message_id.ledger_id(),
                                            message_id.entry_id(), started, time.monotonic())
        return callback

    produced.began = time.monotonic()
    for seq in seqs:
        if seq in faults:
            faults[seq](produced)
        producer.send_async(payload(topic, seq), sent(seq, time.monotonic()))
    producer.flush()
    produced.ended = time.monotonic()
    producer.close()
    return produced


def consume(client: pulsar.Client, topic: str, partitions: int, expected: dict[int, int]) -> dict[int, list]:
    """Each partition read from its start in order, until its `expected` count of distinct messages came (or the
    broker has nothing more for 10 s): (seq, ledger, entry) in delivery order."""
    received: dict[int, list] = {}
    for partition in range(partitions):
        consumer = client.subscribe(f"persistent://{NAMESPACE}/{topic}-partition-{partition}", "bookfleet-check",
                                    initial_position=pulsar.InitialPosition.Earliest)
        delivered, distinct = [], set()
        while len(distinct) < expected.get(partition, 0):
            try:
                message = consumer.receive(10_000)
            except pulsar.Timeout:
                break
            seq = int(message.data().split(b":")[1])
            delivered.append((seq, message.message_id().ledger_id(), message.message_id().entry_id()))
            distinct.add(seq)
        consumer.close()
        received[partition] = delivered
    return received


def order_figures(received: dict[int, list]) -> tuple[int, int]:
    """(duplicates, reordered): a seq delivered again, and a new seq below one already delivered, per partition."""
    duplicates = reordered = 0
    for delivered in received.values():
        seen, highest = set(), -1
        for seq, _, _ in delivered:
            if seq in seen:
                duplicates += 1
                continue
            seen.add(seq)
            reordered += seq < highest
            highest = max(highest, seq)
    return duplicates, reordered


async def entries_missing_payloads(zk: str, topic: str, received: dict[int, list]) -> int:
    """Messages whose payload is not inside the entry bookfleet's client reads at their (ledger, entry)."""
    wanted: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for delivered in received.values():
        for seq, ledger_id, entry_id in delivered:
            wanted[ledger_id][entry_id].append(seq)
    missing = 0
    async with BookKeeper(zk) as bookkeeper:
        for ledger_id, by_entry in wanted.items():
            reader = await bookkeeper.open_ledger(ledger_id, b"")  # Pulsar's default managedLedgerPassword
            async for entry in reader.entries(min(by_entry), max(by_entry)):
                stored = bytes(entry.payload)
                missing += sum(payload(topic, seq) not in stored for seq in by_entry.pop(entry.entry_id, []))
            missing += sum(len(seqs) for seqs in by_entry.values())  # entries the ledger does not have
    return missing


def not_where_acked(zk: str, topic: str, produced: Produced) -> int:
    """Acknowledged messages whose payload is not inside the entry bookfleet's client reads at their MessageId."""
    return asyncio.run(entries_missing_payloads(zk, topic, {
        0: [(seq, acked.ledger_id, acked.entry_id) for seq, acked in produced.acked.items()]
    }))


def ledgers_naming(zk: str, ledger_ids: set[int], bookie_id: str) -> set[int]:
    """The ledgers among `ledger_ids` whose ensembles still name `bookie_id` or that are marked under-replicated."""
    with zkclient.session(zk) as session:
        metadata = MetadataStore(session).read_all(ledger_ids)
        marked = set(UnderReplication(session).ledger_ids())
    return {ledger_id for ledger_id, found in metadata.items()
            if ledger_id in marked or (found is not None and bookie_id in found[0].bookies())}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def run(cluster: StandaloneCluster, broker: PulsarBroker, topic: str, messages: int, partitions: int = 4,
        repair_timeout: float = 300.0) -> dict:
    """The whole run on a fleet with auto-recovery on; its figures (JSON-ready)."""
    broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/partitions", partitions)
    bookies = {bookie.bookie_id: bookie for bookie in cluster.fleet.bookies}
    lost_bookie: list[str] = []
    broker_down: list[float] = []

    def restart_broker() -> None:
        broker_down.append(time.monotonic())
        broker.restart()
        broker_down.append(time.monotonic())

    restart = threading.Thread(target=restart_broker, name="broker-restart")

    def kill_bookie(produced: Produced) -> None:
        """Kill -9 the first bookie of a current ledger's ensemble: the broker's writes change its ensemble."""
        with zkclient.session(cluster.zk) as session:
            metadata, _ = MetadataStore(session).read(produced.last_acked().ledger_id)
        lost_bookie.append(metadata.segments[-1].bookies[0])
        bookies[lost_bookie[0]].kill9()

    def kill_broker(produced: Produced) -> None:
        """Kill -9 the broker with messages in flight and start it again: it recovers (fences) the ledgers it held
        open before writing new ones, and the producer sends again what was not acknowledged."""
        produced.last_acked()
        restart.start()

    client = pulsar.Client(broker.service_url, logger=QUIET, operation_timeout_seconds=120)
    try:
        faults = {messages // 3: kill_bookie, 2 * messages // 3: kill_broker}
        produced = produce(client, topic, range(messages), faults)
        restart.join()
        broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/unload")  # the broker closes its ledgers
        ledger_ids = {acked.ledger_id for acked in produced.acked.values()}
        wait_for(lambda: not ledgers_naming(cluster.zk, ledger_ids, lost_bookie[0]), timeout=repair_timeout,
                 interval=1.0, what=f"auto-recovery to repair the ledgers that named {lost_bookie[0]}")
        expected: dict[int, int] = defaultdict(int)
        for acked in produced.acked.values():
            expected[acked.partition] += 1
        received = consume(client, topic, partitions, expected)  # the topic is loaded again
    finally:
        client.close()
    stored_at: dict[int, set] = defaultdict(set)
    for partition, delivered in received.items():
        for seq, ledger_id, entry_id in delivered:
            stored_at[seq].add((partition, ledger_id, entry_id))
    duplicates, reordered = order_figures(received)
    steady = [acked for acked in produced.acked.values() if acked.acked_at < broker_down[0]]
    acks = sorted(acked.acked_at for acked in produced.acked.values())
    return {
        "messages": messages,
        "partitions": partitions,
        "acked": len(produced.acked),
        "send_failures": produced.failed,
        "lost": sum(seq not in stored_at for seq in produced.acked),
        "reordered": reordered,
        "duplicates": duplicates,
        # read at each acknowledged MessageId itself: a consumer stops at its last new message, and a message the
        # killed broker stored but never acknowledged comes first, from that older entry (Pulsar's at-least-once)
        "not_where_acked": not_where_acked(cluster.zk, topic, produced),
        "not_in_bookfleet_entry": asyncio.run(entries_missing_payloads(cluster.zk, topic, received)),
        "ledgers": len(ledger_ids),
        "killed_bookie": lost_bookie[0],
        "broker_down_s": round(broker_down[1] - broker_down[0], 1),
        "longest_ack_gap_s": round(max(later - earlier for earlier, later in itertools.pairwise(acks)), 1),
        "produce_seconds": round(produced.ended - produced.began, 1),
        # before the broker's kill (the bookie's kill included): with it, its restart is all p99 would say
        "produce_rate_msg_s": round(len(steady) / (broker_down[0] - produced.began)),
        "p99_publish_ms": round(p99([acked.latency for acked in steady]) * 1000, 1),
    }


def rounds(broker: PulsarBroker, messages: int, partitions: int, measured: int) -> dict:
    """`throughput` once, or with `measured` > 1 once to warm the broker's and bookies' JVMs (not counted) and then
    `measured` times on topics of their own: the median round's figures, and every round's rate."""
    if measured <= 1:
        return throughput(broker, "rate", messages, partitions)
    throughput(broker, "warm-up", messages, partitions)
    runs = sorted((throughput(broker, f"rate-{index}", messages, partitions) for index in range(measured)),
                  key=lambda figures: figures["produce_rate_msg_s"])
    return {**runs[len(runs) // 2], "rounds_msg_s": [figures["produce_rate_msg_s"] for figures in runs]}


def throughput(broker: PulsarBroker, topic: str, messages: int, partitions: int = 4) -> dict:
    """Produce `messages` with no fault: the producer's rate and publish latencies on this broker's bookies."""
    broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/partitions", partitions)
    client = pulsar.Client(broker.service_url, logger=QUIET, operation_timeout_seconds=120)
    try:
        produced = produce(client, topic, range(messages), {})
    finally:
        client.close()
    latencies = [acked.latency for acked in produced.acked.values()]
    return {
        "acked": len(produced.acked),
        "produce_rate_msg_s": round(len(produced.acked) / (produced.ended - produced.began)),
        "p50_publish_ms": round(sorted(latencies)[len(latencies) // 2] * 1000, 1),
        "p99_publish_ms": round(p99(latencies) * 1000, 1),
    }
