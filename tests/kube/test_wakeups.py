"""The operator's reconcile loops (kube/runtime/wakeups.py): a pass runs again when woken, when the time it asked for
comes, else at the interval; a stopped loop ends. In milliseconds, on a plain event loop."""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import threading
import time

import pytest

from bookfleet import polling
from bookfleet.kube.runtime import ledgerfeed, wakeups
from bookfleet.meta.metadata import MetadataStore, new_metadata

KEY = ("bookies", "default", "bk-0")
POOLS = wakeups.ClusterPools(4)
POOL = functools.partial(POOLS.of, "default", "bk")


class Stopped:
    """Stands in for kopf's DaemonStopped."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    def wait(self) -> asyncio.Future:
        return asyncio.ensure_future(self.event.wait())


def run(scenario, due: float | None, interval: float = 60.0, jitter: float = 0.0) -> list[float]:
    """Run a loop whose pass returns `due` while `scenario(registry, passes)` drives it; when each pass ran."""
    passes: list[float] = []

    async def main() -> None:
        registry, stopped = wakeups.Wakeups(), Stopped()
        started = time.monotonic()
        loop = asyncio.create_task(wakeups.run_loop(
            registry, KEY, lambda: passes.append(time.monotonic() - started) or due, POOL, stopped, interval, jitter))
        await scenario(registry, passes)
        stopped.event.set()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())
    return passes


async def until(passes: list[float], count: int) -> None:
    while len(passes) < count:
        await asyncio.sleep(0.01)


def test_a_wake_up_runs_a_pass_at_once_instead_of_at_the_interval():
    async def scenario(registry, passes):
        await until(passes, 1)
        registry.wake(("bookies", "default", "other"))  # no loop waits on it: nothing happens
        await asyncio.sleep(0.05)
        assert len(passes) == 1
        registry.wake(KEY)
        await asyncio.wait_for(until(passes, 2), 5)  # not the 60 s interval

    assert len(run(scenario, due=None)) == 2


def test_a_pass_that_asks_for_the_next_sooner_gets_it_and_the_interval_bounds_it():
    async def scenario(registry, passes):
        await asyncio.wait_for(until(passes, 3), 5)

    assert len(run(scenario, due=0.01)) >= 3  # the 60 s interval never came
    assert len(run(scenario, due=30.0, interval=0.01)) >= 3  # nor the 30 s the pass asked for


def test_a_stopped_loop_ends_without_waiting_out_its_pause_and_forgets_its_key():
    registries = []

    async def scenario(registry, passes):
        await until(passes, 1)
        registries.append(registry)
        assert KEY in registry._events

    started = time.monotonic()
    assert len(run(scenario, due=None)) == 1
    assert time.monotonic() - started < 5 and KEY not in registries[0]._events


def test_a_loop_stopped_during_a_pass_ends_within_kopfs_instant_exit_and_its_next_loop_waits_for_that_pass():
    """kopf releases a deleted object's finalizer at once only if its daemon ends within ten zero-time cycles of being
    told to stop (kopf's instant exit), else after the daemon's whole cancellation backoff (60 s)."""
    passing, release = threading.Event(), threading.Event()
    second_loop_passes = []

    def slow_pass() -> None:
        passing.set()
        release.wait(10)

    async def main() -> None:
        registry, stopped = wakeups.Wakeups(), Stopped()
        first = asyncio.create_task(wakeups.run_loop(registry, KEY, slow_pass, POOL, stopped, 60.0))
        await asyncio.to_thread(passing.wait, 5)
        stopped.event.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert first.done()  # the pass is still in flight
        second = asyncio.create_task(wakeups.run_loop(
            registry, KEY, lambda: second_loop_passes.append(release.is_set()), POOL, Stopped(), 60.0))
        await asyncio.sleep(0.1)
        assert second_loop_passes == []  # never two passes of one object at once
        release.set()
        await asyncio.wait_for(registry.passes_ended(5), 5)
        await asyncio.wait_for(until(second_loop_passes, 1), 5)
        assert second_loop_passes == [True]
        second.cancel()

    asyncio.run(main())


def test_a_loop_ends_when_its_object_is_gone_and_a_newer_objects_loop_of_that_name_goes_on():
    """The loops hold no finalizer (kube.handlers), so kopf may never stop a deleted object's loop: the informers'
    deletion ends it, unless that deletion is of an older object of the same name."""
    newer_passes: list[float] = []

    async def main() -> None:
        registry = wakeups.Wakeups()
        old = asyncio.create_task(wakeups.run_loop(registry, KEY, lambda: None, POOL, Stopped(), 60.0, uid="old"))
        await asyncio.sleep(0.05)
        registry.gone(KEY, "old")
        await asyncio.wait_for(old, 5)  # not the 60 s interval, and kopf never said stop
        newer = asyncio.create_task(wakeups.run_loop(registry, KEY, lambda: newer_passes.append(1), POOL, Stopped(),
                                                     60.0, uid="new"))
        await until(newer_passes, 1)
        registry.gone(KEY, "old")  # the informer's late word of the old object
        registry.wake(KEY)
        await asyncio.wait_for(until(newer_passes, 2), 5)
        assert not newer.done()
        registry.gone(KEY, "new")
        await asyncio.wait_for(newer, 5)
        assert KEY not in registry._events

    asyncio.run(main())


def test_only_a_new_generation_wakes_a_loop_and_a_deleted_object_is_forgotten():
    woken: list[object] = []
    registry = wakeups.Wakeups()
    registry.wake = woken.append  # what would be set, in order
    registry.wake_on_new_generation(KEY, 3)  # first seen: its loop's first pass is starting anyway
    registry.wake_on_new_generation(KEY, 3)  # a status patch: same spec
    registry.wake_on_new_generation(KEY, 4)
    registry.wake_on_new_generation(KEY, 4, deleted=True)
    registry.wake_on_new_generation(KEY, 1)  # recreated under the same name
    assert woken == [KEY]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_ledger_woken_many_times_before_its_pass_gets_one_pass_with_the_newest_body():
    clock = FakeClock()
    queue = ledgerfeed.DebouncedQueue(debounce=0.5, rate=1000, clock=clock)
    for version in range(3):
        queue.wake(("ns", "a"), {"v": version})
    queue.wake(("ns", "a"))
    assert queue.take(timeout=0) is None  # still within its debounce
    clock.now += 0.5
    assert queue.take(timeout=0) == (("ns", "a"), {"v": 2})
    assert queue.take(timeout=0) is None and len(queue) == 0


def test_passes_are_rate_limited_after_one_second_of_burst():
    clock = FakeClock()
    queue = ledgerfeed.DebouncedQueue(debounce=0, rate=2, clock=clock)
    for name in "abcdef":
        queue.wake(("ns", name))
    assert [queue.take(timeout=0) for _ in range(3)] == [(("ns", "a"), None), (("ns", "b"), None), None]
    clock.now += 0.5
    assert queue.take(timeout=0) == (("ns", "c"), None) and queue.take(timeout=0) is None


def test_a_ledger_watch_event_wakes_its_pass_only_when_new_or_its_spec_or_id_changed():
    woken: list = []
    feed = ledgerfeed.LedgerFeed(lambda key, body: None, lambda ns, cluster: None, lambda connect: None,
                                 resync=60, retry=1)
    feed.queue.wake = lambda key, payload=None, delay=0.0: woken.append(key)  # type: ignore[method-assign]
    body = {"metadata": {"namespace": "ns", "name": "l", "generation": 1}, "spec": {"cluster": "bk"}}
    feed.ledger_changed(body)
    feed.ledger_changed({**body, "status": {"conditions": []}})  # its own status patch
    feed.ledger_changed({**body, "status": {"ledgerId": 7}})  # an id reserved: its metadata watch is armed next
    feed.ledger_changed({**body, "metadata": {**body["metadata"], "generation": 2}, "status": {"ledgerId": 7}})
    feed.wake_ledger_id(7)
    feed.ledger_changed(body, deleted=True)
    feed.wake_ledger_id(7)
    assert woken == [("ns", "l")] * 4


def test_a_ledger_woken_during_its_pass_is_handed_out_again_only_once_the_pass_is_done():
    clock = FakeClock()
    queue = ledgerfeed.DebouncedQueue(debounce=0, rate=1000, clock=clock)
    queue.wake(("ns", "a"))
    assert queue.take(timeout=0) == (("ns", "a"), None)
    queue.wake(("ns", "a"), {"v": 1})
    assert queue.take(timeout=0) is None  # a second worker must not run it beside the first
    queue.done(("ns", "a"))
    assert queue.take(timeout=0) == (("ns", "a"), {"v": 1})


def test_each_cluster_with_ledgers_gets_one_resync_and_a_cluster_whose_ledgers_all_went_gets_none():
    resynced: list = []
    feed = ledgerfeed.LedgerFeed(lambda key, body: None, lambda ns, cluster: None, lambda connect: None,
                                 resync=60, retry=1, rng=random.Random(1))
    feed.resync_cluster = lambda namespace, cluster: resynced.append((namespace, cluster))  # type: ignore[method-assign]
    ledger = lambda name, cluster: {"metadata": {"namespace": "ns", "name": name, "generation": 1},  # noqa: E731
                                    "spec": {"cluster": cluster}}
    for name, cluster in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        feed.ledger_changed(ledger(name, cluster))
    feed.ledger_changed(ledger("a2", "b"))  # moved to the other cluster
    feed._resync_due_clusters(0.0)
    assert resynced == [] and set(feed._resync_due) == {("ns", "a"), ("ns", "b")}
    feed._resync_due_clusters(100.0)
    assert sorted(resynced) == [("ns", "a"), ("ns", "b")]
    feed.ledger_changed(ledger("a1", "a"), deleted=True)
    feed._resync_due_clusters(300.0)
    assert set(feed._resync_due) == {("ns", "b")} and resynced.count(("ns", "a")) == 1


def test_a_replica_passes_a_clusters_ledgers_only_while_it_acts_for_that_cluster():
    """A paused peer (kopf stopped its cluster loops) must not write Ledgers beside the acting one: what is woken
    meanwhile waits, and is passed once it acts. A Ledger of an unknown cluster is passed (to say so)."""
    passed: list = []
    feed = ledgerfeed.LedgerFeed(lambda key, body: passed.append(key),
                                 lambda ns, cluster: "zk" if cluster == "bk" else None, lambda connect: None,
                                 resync=3600, retry=3600)
    ledger = lambda name, cluster, generation=1: {  # noqa: E731
        "metadata": {"namespace": "ns", "name": name, "generation": generation}, "spec": {"cluster": cluster}}
    feed.start()
    try:
        feed.ledger_changed(ledger("a", "bk"))
        feed.ledger_changed(ledger("orphan", "gone"))
        polling.wait_for(lambda: ("ns", "orphan") in passed, 10, "the orphan's pass")
        time.sleep(0.3)  # absence, not speed: the other Ledger's cluster is not acted for here
        assert ("ns", "a") not in passed
        with feed.acting("ns", "bk"):
            polling.wait_for(lambda: ("ns", "a") in passed, 10, "the parked Ledger's pass")
        feed.ledger_changed(ledger("a", "bk", generation=2))
        time.sleep(0.3)
        assert passed.count(("ns", "a")) == 1
    finally:
        feed.stop()


def test_jittered_intervals_are_drawn_anew_for_each_wait():
    """A fleet's loops start together with the operator; waits drawn anew (not one jittered period per loop)
    spread their resyncs at once."""
    passes = run(lambda registry, passes: asyncio.sleep(1.0), due=None, interval=0.1, jitter=0.5)
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(passes)}
    assert len(passes) >= 4 and len(gaps) > 1 and min(gaps) >= 0.045  # never below interval * (1 - jitter)


def test_a_woken_ledgers_pass_gets_its_body_without_the_managed_fields_it_was_kept_without():
    """The queue keeps a woken Ledger's body as JSON (100,000 of them wait at start-up): the pass gets it back whole
    but for managedFields, which no pass reads."""
    bodies: list = []
    feed = ledgerfeed.LedgerFeed(lambda key, body: bodies.append(body), lambda ns, cluster: None, lambda connect: None,
                                 resync=3600, retry=3600)
    body = {"metadata": {"namespace": "ns", "name": "a", "generation": 1, "finalizers": ["f"],
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"cluster": "bk", "ledgerId": 7}, "status": {"conditions": [{"type": "Valid", "status": "True"}]}}
    feed.start()
    try:
        feed.ledger_changed(body)
        polling.wait_for(lambda: bodies, 10, "the Ledger's pass")
    finally:
        feed.stop()
    assert bodies == [{**body, "metadata": {"namespace": "ns", "name": "a", "generation": 1, "finalizers": ["f"]}}]


def test_the_metadata_watches_of_one_ledger_are_one_watcher_to_zookeepers_client():
    """kazoo keeps a path's watchers in a set: each pass sets the watch again, and only equal watches do not pile up
    until the next change (100,000 Ledgers resynced or woken by repairs, each pass adding one)."""
    feed = ledgerfeed.LedgerFeed(lambda key, body: None, lambda ns, cluster: None, lambda connect: None,
                                 resync=3600, retry=3600)
    assert len({feed.metadata_watch(7), feed.metadata_watch(7)}) == 1
    assert feed.metadata_watch(7) != feed.metadata_watch(8)


def test_a_workers_batch_of_ledgers_gets_their_metadata_read_ahead_each_with_the_watch_its_pass_would_set(zk):
    """At a restart over 100,000 current Ledgers a pass is little more than its metadata read: a worker takes a
    batch and sends their reads together, each pass takes its own (one request per Ledger, as before), and a change
    after the read wakes the Ledger again through the watch that read set."""
    store = MetadataStore(zk)
    ledger_ids = [store.create(new_metadata(["b1:3181", "b2:3181"], 2, 2)) for _ in range(3)]
    seen: dict[int, list] = {ledger_id: [] for ledger_id in ledger_ids}

    def reconcile(key, body):
        ledger_id = int(key[1][1:])  # a pass the watch woke has no body
        pending = feed.read_ahead(zk, ledger_id)
        seen[ledger_id].append(None if pending is None else pending.get()[1])  # the znode version it read

    feed = ledgerfeed.LedgerFeed(reconcile, lambda ns, cluster: "zk", lambda target: zk, resync=3600, retry=3600,
                                 workers=1)
    with feed.acting("ns", "bk"):
        for ledger_id in ledger_ids:  # woken before the worker starts: one batch
            feed.ledger_changed({"metadata": {"namespace": "ns", "name": f"l{ledger_id}", "generation": 1},
                                 "spec": {"cluster": "bk", "ledgerId": ledger_id}})
        feed.start()
        try:
            polling.wait_for(lambda: all(seen.values()), 10, "the three passes")
            changed = ledger_ids[1]
            metadata, version = store.read(changed)
            store.update(changed, metadata.model_copy(update={"custom": {"k": "v"}}), version)
            polling.wait_for(lambda: len(seen[changed]) == 2, 10, "the pass the change woke")
        finally:
            feed.stop()
    assert {ledger_id: versions[0] for ledger_id, versions in seen.items()} == dict.fromkeys(ledger_ids, 0)
    assert seen[changed] == [0, 1] and all(len(seen[i]) == 1 for i in ledger_ids if i != changed)


def test_a_zookeeper_that_cannot_be_reached_leaves_the_read_ahead_to_the_pass_and_the_worker_running():
    """A cluster whose ZooKeeper session cannot be had (its credential's Secret missing, a closed client): the pass
    meets the same error, fails and is retried; the worker that sent reads ahead goes on with the other Ledgers."""
    passes: list = []

    def unreachable(target):
        raise ConnectionError(f"no session to {target}")

    feed = ledgerfeed.LedgerFeed(lambda key, body: passes.append(key), lambda ns, cluster: "zk", unreachable,
                                 resync=3600, retry=3600, workers=1)
    with feed.acting("ns", "bk"):
        for index in range(3):
            feed.ledger_changed({"metadata": {"namespace": "ns", "name": f"l{index}", "generation": 1},
                                 "spec": {"cluster": "bk", "ledgerId": index}})
        feed.start()
        try:
            polling.wait_for(lambda: len(passes) == 3, 10, "the three passes")
        finally:
            feed.stop()
    assert sorted(passes) == [("ns", f"l{index}") for index in range(3)]


def test_one_clusters_blocked_passes_leave_another_clusters_loops_running():
    """Every thread of one cluster's pool held by a pass that never returns (its ZooKeeper gone: kazoo holds a call
    until the server is back): another cluster's loop still passes, on its own pool."""
    pools, blocked, release = wakeups.ClusterPools(2), threading.Semaphore(0), threading.Event()
    other_passes: list[float] = []

    def stuck_pass() -> None:
        blocked.release()
        release.wait(10)

    async def main() -> None:
        registry, stopped = wakeups.Wakeups(), Stopped()
        sick_pool = functools.partial(pools.of, "default", "sick")
        stuck = [asyncio.create_task(wakeups.run_loop(registry, ("bookies", "default", f"sick-{i}"), stuck_pass,
                                                      sick_pool, stopped, 60.0)) for i in range(3)]
        for _ in range(2):
            await asyncio.to_thread(blocked.acquire, timeout=5)
        healthy = asyncio.create_task(wakeups.run_loop(registry, KEY, lambda: other_passes.append(1),
                                                       functools.partial(pools.of, "default", "bk"), stopped, 60.0))
        await asyncio.wait_for(until(other_passes, 1), 5)
        assert not blocked.acquire(blocking=False)  # the sick cluster's third pass still waits for a thread
        release.set()
        stopped.event.set()
        await asyncio.wait_for(asyncio.gather(healthy, *stuck), 5)

    asyncio.run(main())
    pools.shutdown()


def test_a_released_clusters_pool_is_shut_down_and_a_late_pass_gets_a_fresh_one():
    """A deleted cluster's loop ends and releases its pool (no idle threads left behind per deleted cluster); one of
    its Bookies' loops still running asks for a pool at its next pass and gets a new one."""
    pools = wakeups.ClusterPools(2)
    released = pools.of("default", "gone")
    assert released.submit(lambda: "passed").result(5) == "passed"
    pools.release("default", "gone")
    with pytest.raises(RuntimeError, match="shutdown"):
        released.submit(lambda: None)
    fresh = pools.of("default", "gone")
    assert fresh is not released and fresh.submit(lambda: "passed").result(5) == "passed"
    pools.shutdown()
