import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Enumeration;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.Semaphore;

import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.BookKeeper.DigestType;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;

/**
 * Apache BookKeeper's own ledger client ({@link BookKeeper}, with ZooKeeper metadata) driven through the steps the
 * interop tests need and the shell has no command for. Every line it prints is one fact ({@code ledger 7},
 * {@code acked 12}, ...); a failure prints {@code FAILED ...} and exits 1.
 *
 * <ul>
 * <li>{@code CONF write-and-hold E W A N}: creates a ledger, adds N entries one at a time ({@code acked I} once
 * each is acknowledged), prints {@code holding} and waits to be killed: a writer that died with its ledger open.
 * <li>{@code CONF recover LEDGER}: opens the ledger with recovery (fencing, recovery adds, close) and reads it
 * whole: {@code recovered lac=L}, {@code read N}, {@code closed last=L}.
 * <li>{@code CONF write-killing E W A N KILL_AFTER PID NEED}: creates ledgers until one's ensemble holds every
 * bookie id of the comma-separated NEED, adds N entries (up to 20 in flight), kills process PID with SIGKILL once
 * entry KILL_AFTER is acknowledged, closes and reads the ledger back with a new client: {@code acked I...},
 * {@code ensembles {0=[...], ...}}, {@code read N}.
 * <li>{@code CONF explicit-lac E W A N}: creates a ledger, adds N entries, waits five of the configuration's
 * {@code explicitLacInterval} (the writer sends its LAC explicitly meanwhile), then reads the explicit LAC with a
 * second client as {@code read-explicit-lac} does, and closes the ledger: {@code ledger L}, {@code explicit-lac X}.
 * <li>{@code CONF read-explicit-lac LEDGER}: opens the ledger without recovery and reads its explicit LAC (READ_LAC
 * from the bookies, each answer's digest checked): {@code explicit-lac X}.
 * </ul>
 */
public final class LedgerInterop {
    static final byte[] PASSWORD = "interop".getBytes(StandardCharsets.UTF_8);
    static final DigestType DIGEST = DigestType.CRC32C;
    private static final int IN_FLIGHT = 20;

    public static void main(String[] args) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.loadConf(new File(args[0]).toURI().toURL());
        int status = 0;
        try (BookKeeper bk = new BookKeeper(conf)) {
            switch (args[1]) {
                case "write-and-hold":
                    writeAndHold(bk, ints(args, 2, 4), Integer.parseInt(args[5]));
                    break;
                case "recover":
                    recover(bk, Long.parseLong(args[2]));
                    break;
                case "explicit-lac":
                    explicitLac(bk, conf, ints(args, 2, 3), Integer.parseInt(args[5]));
                    break;
                case "read-explicit-lac":
                    readExplicitLac(bk, Long.parseLong(args[2]));
                    break;
                case "write-killing":
                    writeKilling(bk, conf, ints(args, 2, 4), Integer.parseInt(args[5]), Integer.parseInt(args[6]),
                            Long.parseLong(args[7]), Arrays.asList(args[8].split(",")));
                    break;
                default:
                    throw new Failure("unknown command " + args[1]);
            }
        } catch (Failure | org.apache.bookkeeper.client.BKException failure) {
            System.out.println("FAILED " + failure);
            status = 1;
        }
        System.out.flush();
        System.exit(status);
    }

    static byte[] payload(long entryId) {
        return ("entry " + entryId + " of a Java writer").getBytes(StandardCharsets.UTF_8);
    }

    private static int[] ints(String[] args, int from, int count) {
        int[] values = new int[count];
        for (int i = 0; i < count; i++) {
            values[i] = Integer.parseInt(args[from + i]);
        }
        return values;
    }

    private static void writeAndHold(BookKeeper bk, int[] shape, int entries) throws Exception {
        LedgerHandle ledger = bk.createLedger(shape[0], shape[1], shape[2], DIGEST, PASSWORD);
        say("ledger " + ledger.getId());
        for (int i = 0; i < entries; i++) {
            say("acked " + ledger.addEntry(payload(i)));
        }
        say("holding");
        Thread.sleep(Long.MAX_VALUE);
    }

    private static void recover(BookKeeper bk, long ledgerId) throws Exception {
        LedgerHandle ledger = bk.openLedger(ledgerId, DIGEST, PASSWORD);
        long lac = ledger.getLastAddConfirmed();
        say("recovered lac=" + lac);
        say("read " + readAll(ledger, lac));
        LedgerHandle reopened = bk.openLedgerNoRecovery(ledgerId, DIGEST, PASSWORD);
        if (!reopened.isClosed()) {
            throw new Failure("ledger " + ledgerId + " is not closed after recovery");
        }
        say("closed last=" + reopened.getLedgerMetadata().getLastEntryId());
    }

    private static void explicitLac(BookKeeper bk, ClientConfiguration conf, int[] shape, int entries)
            throws Exception {
        LedgerHandle ledger = bk.createLedger(shape[0], shape[1], shape[2], DIGEST, PASSWORD);
        say("ledger " + ledger.getId());
        for (int i = 0; i < entries; i++) {
            ledger.addEntry(payload(i));
        }
        Thread.sleep(5L * conf.getExplictLacInterval()); // BookKeeper's spelling
        try (BookKeeper reader = new BookKeeper(conf)) {
            readExplicitLac(reader, ledger.getId());
        }
        ledger.close();
    }

    private static void readExplicitLac(BookKeeper bk, long ledgerId) throws Exception {
        LedgerHandle ledger = bk.openLedgerNoRecovery(ledgerId, DIGEST, PASSWORD);
        say("explicit-lac " + ledger.readExplicitLastConfirmed());
    }

    private static void writeKilling(BookKeeper bk, ClientConfiguration conf, int[] shape, int entries,
            int killAfter, long pid, List<String> need) throws Exception {
        LedgerHandle ledger = mixedLedger(bk, shape, need);
        say("ledger " + ledger.getId());
        Set<Long> acked = new ConcurrentSkipListSet<>();
        Semaphore room = new Semaphore(IN_FLIGHT);
        CompletableFuture<Void> failed = new CompletableFuture<>();
        CompletableFuture<Void> killed = new CompletableFuture<>();
        for (int i = 0; i < entries && !failed.isDone(); i++) {
            room.acquire();
            ledger.asyncAddEntry(payload(i), (rc, handle, entryId, ctx) -> {
                if (rc == 0) {
                    acked.add(entryId);
                    if (entryId == killAfter) {
                        ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
                        killed.complete(null);
                    }
                } else {
                    failed.complete(null);
                }
                room.release();
            }, null);
        }
        room.acquire(IN_FLIGHT);
        ledger.close();
        for (long entryId : acked) {
            say("acked " + entryId);
        }
        if (!killed.isDone()) {
            throw new Failure("entry " + killAfter + " was never acknowledged: nothing was killed");
        }
        say("ensembles " + ledger.getLedgerMetadata().getAllEnsembles());
        try (BookKeeper reader = new BookKeeper(conf)) {
            LedgerHandle readBack = reader.openLedger(ledger.getId(), DIGEST, PASSWORD);
            say("read " + readAll(readBack, readBack.getLastAddConfirmed()));
        }
    }

    /** A ledger whose first ensemble names every bookie of `need` (others are deleted). */
    private static LedgerHandle mixedLedger(BookKeeper bk, int[] shape, List<String> need) throws Exception {
        for (int attempt = 0; attempt < 50; attempt++) {
            LedgerHandle ledger = bk.createLedger(shape[0], shape[1], shape[2], DIGEST, PASSWORD);
            List<String> ensemble = new ArrayList<>();
            for (BookieId bookie : ledger.getLedgerMetadata().getEnsembleAt(0)) {
                ensemble.add(bookie.toString());
            }
            if (ensemble.containsAll(need)) {
                return ledger;
            }
            ledger.close();
            bk.deleteLedger(ledger.getId());
        }
        throw new Failure("no ensemble of 50 held " + need);
    }

    /** Reads entries 0..last, checking every payload; the number read. */
    private static long readAll(LedgerHandle ledger, long last) throws Exception {
        if (last < 0) {
            return 0;
        }
        Set<Long> seen = new TreeSet<>();
        Enumeration<LedgerEntry> entries = ledger.readEntries(0, last);
        while (entries.hasMoreElements()) {
            LedgerEntry entry = entries.nextElement();
            if (!Arrays.equals(entry.getEntry(), payload(entry.getEntryId()))) {
                throw new Failure("entry " + entry.getEntryId() + " differs");
            }
            seen.add(entry.getEntryId());
        }
        if (seen.size() != last + 1) {
            throw new Failure("read " + seen.size() + " entries, expected " + (last + 1));
        }
        return seen.size();
    }

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static final class Failure extends RuntimeException {
        Failure(String message) {
            super(message);
        }
    }
}
