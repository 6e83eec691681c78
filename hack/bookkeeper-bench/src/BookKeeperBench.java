import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import javax.management.NotificationEmitter;
import javax.management.openmbean.CompositeData;

import com.sun.management.GarbageCollectionNotificationInfo;

import org.HdrHistogram.ConcurrentHistogram;
import org.HdrHistogram.Histogram;
import org.apache.bookkeeper.client.AsyncCallback;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.BookKeeperAdmin;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.conf.ServerConfiguration;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

/**
 * The Java reference side of `bookfleet bench bookkeeper`: what `bookfleet bench client` does, through Apache
 * BookKeeper's own client against its own bookies.
 *
 * <p>{@code bookie ZK ROOT CONF} makes a fresh cluster under ROOT unless one is there (one per run, so no run sees
 * another's bookies), then runs BookKeeper's own bookie main with CONF: one JVM start per bookie, none for the init.
 * {@code load ZK ROOT key=value...} creates one ledger (E/Qw/Qa, CRC32C digest), keeps {@code in_flight} adds
 * outstanding for {@code seconds} (each completion issues the next add), then adds at half the rate reached, those
 * due at each millisecond tick, for {@code seconds}; it prints one JSON object with the figures of both phases
 * (HdrHistogram percentiles, microsecond precision) and the CPU per entry of this JVM and of the bookie processes
 * named by {@code bookie_pids}. An unmeasured warm-up phase comes first: the JIT, not the bookie, would otherwise be
 * measured in the first seconds, and the comparison should be with Java at its best. The half-load phase's edges
 * are told on stdout ({@code half-load start}, {@code half-load end}), each waiting for a line on stdin: the bench
 * reads the bookies' histograms and the processes' CPU and run-queue waits right there. Of the half load it also
 * reports what only this JVM knows: its collections (count, total and longest pause) and how late its pacing
 * thread woke for each 1 ms tick, under the keys bookfleet's {@code bench client} gives its own.
 */
public final class BookKeeperBench {
    private static final long CLOCK_TICKS_PER_SECOND = 100;

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: BookKeeperBench bookie ZK ROOT CONF | load ZK ROOT key=value...");
            System.exit(2);
        }
        String uri = "zk+hierarchical://" + args[1] + args[2];
        if (args[0].equals("bookie")) {
            init(args[1], args[2], uri);
            org.apache.bookkeeper.server.Main.main(new String[] {"--conf", args[3]});
            return;
        }
        Map<String, String> options = new LinkedHashMap<>();
        for (int i = 3; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            options.put(pair[0], pair[1]);
        }
        try {
            System.out.println(load(uri, options));
        } catch (Throwable failed) {
            failed.printStackTrace();
            System.exit(1);  // the client's threads would keep this JVM up
        }
        System.exit(0);
    }

    private static void init(String zk, String root, String uri) throws Exception {
        String parent = root.substring(0, root.lastIndexOf('/'));
        CompletableFuture<Void> connected = new CompletableFuture<>();
        ZooKeeper zooKeeper = new ZooKeeper(zk, 30_000, event -> connected.complete(null));
        try {
            connected.get(30, TimeUnit.SECONDS);
            if (!parent.isEmpty()) {
                try {
                    zooKeeper.create(parent, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
                } catch (KeeperException.NodeExistsException exists) {
                    // made by an earlier run
                }
            }
        } finally {
            zooKeeper.close();
        }
        ServerConfiguration conf = new ServerConfiguration();
        conf.setMetadataServiceUri(uri);
        try {
            BookKeeperAdmin.initNewCluster(conf);  // false: another bookie of this cluster made it first
        } catch (Exception raced) {
            // the other bookies of this cluster init at the same moment: one of them made it
            if (BookKeeperAdmin.initNewCluster(conf)) {
                throw new IllegalStateException("no cluster under " + uri + " after a failed init", raced);
            }
        }
    }

    private static String load(String uri, Map<String, String> options) throws Exception {
        int ensemble = Integer.parseInt(options.get("ensemble"));
        int writeQuorum = Integer.parseInt(options.get("write_quorum"));
        int ackQuorum = Integer.parseInt(options.get("ack_quorum"));
        int entrySize = Integer.parseInt(options.get("entry_size"));
        int inFlight = Integer.parseInt(options.get("in_flight"));
        double seconds = Double.parseDouble(options.get("seconds"));
        double warmup = Double.parseDouble(options.getOrDefault("warmup", "2"));
        boolean v2 = options.get("protocol").equals("v2");
        List<Long> bookiePids = new ArrayList<>();
        for (String pid : options.getOrDefault("bookie_pids", "").split(",")) {
            if (!pid.isEmpty()) {
                bookiePids.add(Long.parseLong(pid));
            }
        }
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setUseV2WireProtocol(v2);
        conf.setAddEntryTimeout(60);
        // The client's own add throttle (5000 by default) is above our in-flight counts: the load sets the pace.
        conf.setThrottleValue(0);
        byte[] payload = new byte[entrySize];
        new Random(1).nextBytes(payload);
        Map<String, Object> report = new LinkedHashMap<>();
        try (BookKeeper bookKeeper = connectWhenClusterReady(conf)) {
            LedgerHandle ledger = createWhenBookiesRegistered(bookKeeper, ensemble, writeQuorum, ackQuorum);
            if (warmup > 0) {
                fullLoad(ledger, payload, warmup, inFlight);
            }
            long cpu = processCpuNanos();
            long bookiesCpu = bookiesCpuNanos(bookiePids);
            long started = System.nanoTime();
            Histogram full = fullLoad(ledger, payload, seconds, inFlight);
            double elapsed = (System.nanoTime() - started) / 1e9;
            long entries = full.getTotalCount();
            summarize(report, "full_", full, elapsed, entrySize);
            report.put("full_client_cpu_us_per_entry", (processCpuNanos() - cpu) / 1e3 / entries);
            report.put("full_bookies_cpu_us_per_entry", (bookiesCpuNanos(bookiePids) - bookiesCpu) / 1e3 / entries);
            double halfRate = entries / elapsed / 2;
            report.put("half_rate_target", halfRate);
            BufferedReader bench = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            Histogram tickLags = new Histogram(TimeUnit.MINUTES.toMicros(1), 3);
            GcPauses gcPauses = new GcPauses();
            phaseEdge(bench, "half-load start");
            started = System.nanoTime();
            gcPauses.start();
            Histogram half = pacedLoad(ledger, payload, seconds, halfRate, tickLags);
            double halfElapsed = (System.nanoTime() - started) / 1e9;
            gcPauses.stop(report, "half_client_gc_");
            phaseEdge(bench, "half-load end");
            summarize(report, "half_", half, halfElapsed, entrySize);
            report.put("half_client_loop_lag_p50_ms", tickLags.getValueAtPercentile(50) / 1e3);
            report.put("half_client_loop_lag_p99_ms", tickLags.getValueAtPercentile(99) / 1e3);
            report.put("half_client_loop_lag_max_ms", tickLags.getMaxValue() / 1e3);
            ledger.close();
        }
        return toJson(report);
    }

    /** The bookies init the cluster as they start, so it may not be there yet when this client is. */
    static BookKeeper connectWhenClusterReady(ClientConfiguration conf) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        while (true) {
            try {
                return new BookKeeper(conf);
            } catch (BKException | IOException notYet) {
                if (System.nanoTime() > deadline) {
                    throw notYet;
                }
                Thread.sleep(200);
            }
        }
    }

    private static LedgerHandle createWhenBookiesRegistered(BookKeeper bookKeeper, int e, int qw, int qa)
            throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        while (true) {
            try {
                return bookKeeper.createLedger(e, qw, qa, BookKeeper.DigestType.CRC32C,
                        "bench".getBytes(StandardCharsets.UTF_8));
            } catch (BKException.BKNotEnoughBookiesException | BKException.ZKException notYet) {
                if (System.nanoTime() > deadline) {
                    throw notYet;
                }
                Thread.sleep(200);
            }
        }
    }

    /** Keep {@code inFlight} adds outstanding; each completion issues the next one until the deadline. */
    private static Histogram fullLoad(LedgerHandle ledger, byte[] payload, double seconds, int inFlight)
            throws Exception {
        Histogram latencies = new ConcurrentHistogram(TimeUnit.MINUTES.toMicros(1), 3);
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        AtomicLong outstanding = new AtomicLong(inFlight);
        CompletableFuture<Void> finished = new CompletableFuture<>();
        AsyncCallback.AddCallback[] completed = new AsyncCallback.AddCallback[1];
        completed[0] = (rc, handle, entryId, context) -> {
            long now = System.nanoTime();
            if (rc != BKException.Code.OK) {
                finished.completeExceptionally(BKException.create(rc));
                return;
            }
            latencies.recordValue(Math.max(1, (now - (Long) context) / 1000));
            if (now < deadline) {
                handle.asyncAddEntry(payload, completed[0], System.nanoTime());
            } else if (outstanding.decrementAndGet() == 0) {
                finished.complete(null);
            }
        };
        for (int i = 0; i < inFlight; i++) {
            ledger.asyncAddEntry(payload, completed[0], System.nanoTime());
        }
        finished.get();
        return latencies;
    }

    /** Tell the bench that a phase starts or ended, and wait until it has taken its readings (its line on stdin). */
    private static void phaseEdge(BufferedReader bench, String edge) throws IOException {
        System.out.println(edge);
        System.out.flush();
        if (bench.readLine() == null) {
            throw new IOException("the bench closed this client's stdin at " + edge);
        }
    }

    /** This JVM's collections between {@code start} and {@code stop}: counts and times from the collectors' beans
     * (exact), the longest pause from their notifications (delivered a moment after each collection). */
    private static final class GcPauses {
        private final List<GarbageCollectorMXBean> collectors = ManagementFactory.getGarbageCollectorMXBeans();
        private final AtomicLong longestMs = new AtomicLong();
        private volatile boolean recording;
        private long runs;
        private long totalMs;

        GcPauses() {
            for (GarbageCollectorMXBean collector : collectors) {
                ((NotificationEmitter) collector).addNotificationListener((notification, handback) -> {
                    if (recording && notification.getType().equals(
                            GarbageCollectionNotificationInfo.GARBAGE_COLLECTION_NOTIFICATION)) {
                        long pause = GarbageCollectionNotificationInfo.from((CompositeData) notification.getUserData())
                                .getGcInfo().getDuration();
                        longestMs.accumulateAndGet(pause, Math::max);
                    }
                }, null, null);
            }
        }

        void start() {
            for (GarbageCollectorMXBean collector : collectors) {
                runs -= collector.getCollectionCount();
                totalMs -= collector.getCollectionTime();
            }
            recording = true;
        }

        void stop(Map<String, Object> report, String prefix) {
            for (GarbageCollectorMXBean collector : collectors) {
                runs += collector.getCollectionCount();
                totalMs += collector.getCollectionTime();
            }
            recording = false;
            report.put(prefix + "runs", runs);
            report.put(prefix + "max_ms", (double) longestMs.get());
            report.put(prefix + "total_ms", (double) totalMs);
        }
    }

    /** Issue adds at {@code rate} per second, those due at each millisecond tick, and time each one; how late each
     * tick woke goes to {@code tickLags} (microseconds). */
    private static Histogram pacedLoad(LedgerHandle ledger, byte[] payload, double seconds, double rate,
                                       Histogram tickLags) throws Exception {
        Histogram latencies = new ConcurrentHistogram(TimeUnit.MINUTES.toMicros(1), 3);
        AtomicLong outstanding = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AsyncCallback.AddCallback completed = (rc, handle, entryId, context) -> {
            if (rc == BKException.Code.OK) {
                latencies.recordValue(Math.max(1, (System.nanoTime() - (Long) context) / 1000));
            } else {
                failure.compareAndSet(null, BKException.create(rc));
            }
            outstanding.decrementAndGet();
        };
        long start = System.nanoTime();
        long deadline = start + (long) (seconds * 1e9);
        long issued = 0;
        long now;
        while ((now = System.nanoTime()) < deadline) {
            long due = (long) ((now - start) / 1e9 * rate) - issued;
            outstanding.addAndGet(due);
            for (long i = 0; i < due; i++) {
                ledger.asyncAddEntry(payload, completed, now);
            }
            issued += due;
            long toNextTick = 1_000_000 - (System.nanoTime() - start) % 1_000_000;
            long wake = System.nanoTime() + toNextTick;
            TimeUnit.NANOSECONDS.sleep(toNextTick);
            tickLags.recordValue(Math.max(0, (System.nanoTime() - wake) / 1000));
        }
        while (outstanding.get() > 0 && failure.get() == null) {
            Thread.sleep(1);
        }
        if (failure.get() != null) {
            throw new IllegalStateException(failure.get());
        }
        return latencies;
    }

    private static void summarize(Map<String, Object> report, String prefix, Histogram latencies, double elapsed,
                                  int entrySize) {
        long entries = latencies.getTotalCount();
        report.put(prefix + "entries", entries);
        report.put(prefix + "entries_per_s", entries / elapsed);
        report.put(prefix + "mb_per_s", entries * (double) entrySize / elapsed / 1e6);
        report.put(prefix + "p50_ms", latencies.getValueAtPercentile(50) / 1e3);
        report.put(prefix + "p99_ms", latencies.getValueAtPercentile(99) / 1e3);
        report.put(prefix + "p999_ms", latencies.getValueAtPercentile(99.9) / 1e3);
    }

    private static long processCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean)
                java.lang.management.ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    /** User + system CPU of the bookie processes so far (Linux /proc, clock ticks of 1/100 s). */
    private static long bookiesCpuNanos(List<Long> pids) throws IOException {
        long ticks = 0;
        for (long pid : pids) {
            String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
            String[] fields = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            ticks += Long.parseLong(fields[11]) + Long.parseLong(fields[12]);
        }
        return ticks * (1_000_000_000L / CLOCK_TICKS_PER_SECOND);
    }

    private static String toJson(Map<String, Object> report) {
        StringBuilder json = new StringBuilder("{");
        for (Map.Entry<String, Object> field : report.entrySet()) {
            if (json.length() > 1) {
                json.append(", ");
            }
            json.append('"').append(field.getKey()).append("\": ").append(field.getValue());
        }
        return json.append('}').toString();
    }
}
