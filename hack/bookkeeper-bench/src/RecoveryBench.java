import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import io.netty.buffer.Unpooled;

import org.apache.bookkeeper.client.BookKeeperAdmin;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;

/**
 * The Java reference of `bookfleet bench bookkeeper --recovery`: write {@code ledgers} closed ledgers of
 * {@code entries} entries (E/Qw/Qa as ours), SIGKILL the bookie process {@code victim_pid} (registered as
 * {@code victim}), then poll every ledger's metadata until no ensemble names the lost bookie: the bookies' own
 * AutoRecovery (auditor + replication workers, in-process) does the work. Prints one JSON object.
 *
 * <p>Usage: {@code RecoveryBench ZK ROOT key=value...}.
 */
public final class RecoveryBench {
    private static final int LEDGERS_IN_FLIGHT = 8;

    public static void main(String[] args) throws Exception {
        Map<String, String> options = new LinkedHashMap<>();
        for (int i = 2; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            options.put(pair[0], pair[1]);
        }
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri("zk+hierarchical://" + args[0] + args[1]);
        conf.setAddEntryTimeout(60);
        Map<String, Object> report = new LinkedHashMap<>();
        try (BookKeeper bookKeeper = BookKeeperBench.connectWhenClusterReady(conf)) {
            run(bookKeeper, options, report);
        } catch (Throwable failed) {
            failed.printStackTrace();
            System.exit(1);  // the client's threads would keep this JVM up
        }
        StringBuilder json = new StringBuilder("{");
        for (Map.Entry<String, Object> field : report.entrySet()) {
            json.append(json.length() > 1 ? ", " : "").append('"').append(field.getKey()).append("\": ")
                    .append(field.getValue());
        }
        System.out.println(json.append('}'));
        System.exit(0);
    }

    private static void run(BookKeeper bookKeeper, Map<String, String> options, Map<String, Object> report)
            throws Exception {
        int ledgers = Integer.parseInt(options.get("ledgers"));
        int entries = Integer.parseInt(options.get("entries"));
        int entrySize = Integer.parseInt(options.get("entry_size"));
        int ensemble = Integer.parseInt(options.get("ensemble"));
        int writeQuorum = Integer.parseInt(options.get("write_quorum"));
        int ackQuorum = Integer.parseInt(options.get("ack_quorum"));
        BookieId victim = BookieId.parse(options.get("victim"));
        long victimPid = Long.parseLong(options.get("victim_pid"));

        awaitBookies(bookKeeper, Integer.parseInt(options.get("bookies")));
        long started = System.nanoTime();
        List<Long> written = fill(bookKeeper, ledgers, entries, entrySize, ensemble, writeQuorum, ackQuorum);
        report.put("write_seconds", (System.nanoTime() - started) / 1e9);
        Set<Long> affected = new HashSet<>();
        for (long ledgerId : written) {
            if (names(bookKeeper.getLedgerMetadata(ledgerId).get(), victim)) {
                affected.add(ledgerId);
            }
        }
        report.put("ledgers_on_lost_bookie", affected.size());

        ProcessHandle.of(victimPid).orElseThrow().destroyForcibly();
        long lostAt = System.nanoTime();
        long deadline = lostAt + TimeUnit.MINUTES.toNanos(Long.parseLong(options.getOrDefault("minutes", "20")));
        Double firstHealed = null;
        while (!affected.isEmpty() && System.nanoTime() < deadline) {
            Thread.sleep(100);
            List<Long> healed = new ArrayList<>();
            for (long ledgerId : affected) {
                if (!names(bookKeeper.getLedgerMetadata(ledgerId).get(), victim)) {
                    healed.add(ledgerId);
                }
            }
            if (!healed.isEmpty() && firstHealed == null) {
                firstHealed = (System.nanoTime() - lostAt) / 1e9;
            }
            healed.forEach(affected::remove);
        }
        report.put("seconds_loss_to_first_ledger_replicated", firstHealed);
        report.put("seconds_loss_to_full_replication", (System.nanoTime() - lostAt) / 1e9);
        report.put("ledgers_left_unreplicated", affected.size());
    }

    private static boolean names(LedgerMetadata metadata, BookieId bookie) {
        return metadata.getAllEnsembles().values().stream().anyMatch(ensemble -> ensemble.contains(bookie));
    }

    /** Create, fill and close the ledgers, a few at once (one thread each; every ledger's adds pipelined). */
    private static List<Long> fill(BookKeeper bookKeeper, int ledgers, int entries, int entrySize, int ensemble,
                                   int writeQuorum, int ackQuorum) throws Exception {
        byte[] payload = new byte[entrySize];
        new Random(1).nextBytes(payload);
        byte[] password = "bench".getBytes(StandardCharsets.UTF_8);
        ExecutorService writers = Executors.newFixedThreadPool(LEDGERS_IN_FLIGHT);
        List<Future<Long>> ids = new ArrayList<>();
        for (int i = 0; i < ledgers; i++) {
            ids.add(writers.submit(() -> {
                LedgerHandle ledger = bookKeeper.createLedger(ensemble, writeQuorum, ackQuorum,
                        BookKeeper.DigestType.CRC32C, password);
                List<CompletableFuture<Long>> adds = new ArrayList<>();
                for (int entry = 0; entry < entries; entry++) {
                    adds.add(ledger.appendAsync(Unpooled.wrappedBuffer(payload)));
                }
                CompletableFuture.allOf(adds.toArray(new CompletableFuture[0])).get();
                ledger.close();
                return ledger.getId();
            }));
        }
        List<Long> written = new ArrayList<>();
        for (Future<Long> id : ids) {
            written.add(id.get());
        }
        writers.shutdown();
        return written;
    }

    /** Every bookie must be registered before the first ledger, or the victim would hold no ledger at all. */
    private static void awaitBookies(BookKeeper bookKeeper, int bookies) throws Exception {
        BookKeeperAdmin admin = new BookKeeperAdmin(bookKeeper);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(180);
        while (true) {
            try {
                if (admin.getAvailableBookies().size() >= bookies) {
                    return;
                }
            } catch (BKException.ZKException notYet) {
                // the bookies init the cluster as they start
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("fewer than " + bookies + " bookies registered");
            }
            Thread.sleep(200);
        }
    }
}
