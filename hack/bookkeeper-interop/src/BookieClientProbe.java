import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.buffer.UnpooledByteBufAllocator;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.util.ReferenceCounted;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.api.WriteFlag;
import org.apache.bookkeeper.common.util.OrderedExecutor;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;
import org.apache.bookkeeper.net.BookieSocketAddress;
import org.apache.bookkeeper.proto.BookieClientImpl;
import org.apache.bookkeeper.proto.BookieProtocol;
import org.apache.bookkeeper.proto.DataFormats.LedgerMetadataFormat.DigestType;
import org.apache.bookkeeper.proto.checksum.DigestManager;
import org.apache.bookkeeper.stats.NullStatsLogger;
import org.apache.bookkeeper.util.ByteBufList;

/**
 * Drives Apache BookKeeper's own per-bookie client ({@link BookieClientImpl}) against one bookie, with BookKeeper's
 * own CRC32C DigestManager, over protocol V2 or V3: no ZooKeeper, no ledger metadata, just the wire.
 *
 * <p>{@code BookieClientProbe HOST PORT v2|v3 LEDGER}: adds entries 0-9, reads them back (digests checked),
 * reads entry -1, then (V3) READ_LAC, WRITE_LAC, FORCE_LEDGER, GET_BOOKIE_INFO and a piggybacked long poll, or
 * (V2) BATCH_READ; then fences the ledger with a fencing read, sees an add refused as fenced and a recovery add
 * accepted. Prints one line per step ({@code ok STEP details}); the first unexpected answer prints
 * {@code FAILED STEP ...} and exits 1.
 */
public final class BookieClientProbe {
    private static final byte[] PASSWORD = "interop".getBytes(StandardCharsets.UTF_8);
    private static final int ENTRIES = 10;

    private final BookieClientImpl client;
    private final BookieId bookie;
    private final long ledgerId;
    private final boolean v2;
    private final byte[] masterKey;
    private final DigestManager digests;

    private BookieClientProbe(BookieClientImpl client, BookieId bookie, long ledgerId, boolean v2) throws Exception {
        this.client = client;
        this.bookie = bookie;
        this.ledgerId = ledgerId;
        this.v2 = v2;
        this.masterKey = DigestManager.generateMasterKey(PASSWORD);
        this.digests = DigestManager.instantiate(ledgerId, PASSWORD, DigestType.CRC32C,
                UnpooledByteBufAllocator.DEFAULT, v2);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: BookieClientProbe HOST PORT v2|v3 LEDGER");
            System.exit(2);
        }
        boolean v2 = args[2].equals("v2");
        ClientConfiguration conf = new ClientConfiguration();
        conf.setUseV2WireProtocol(v2);
        conf.setAddEntryTimeout(20);
        conf.setReadEntryTimeout(20);
        NioEventLoopGroup loop = new NioEventLoopGroup(1);
        OrderedExecutor executor = OrderedExecutor.newBuilder().name("probe").numThreads(1).build();
        ScheduledExecutorService scheduler = Executors.newSingleThreadScheduledExecutor();
        BookieClientImpl client = new BookieClientImpl(conf, loop, UnpooledByteBufAllocator.DEFAULT, executor,
                scheduler, NullStatsLogger.INSTANCE, BookieSocketAddress.LEGACY_BOOKIEID_RESOLVER);
        BookieId bookie = new BookieSocketAddress(args[0], Integer.parseInt(args[1])).toBookieId();
        int status = 0;
        try {
            new BookieClientProbe(client, bookie, Long.parseLong(args[3]), v2).run();
        } catch (ProbeFailure failure) {
            System.out.println("FAILED " + failure.getMessage());
            status = 1;
        } finally {
            System.out.flush();
            client.close();
            executor.shutdownNow();
            scheduler.shutdownNow();
            loop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
        }
        System.exit(status);
    }

    private void run() throws Exception {
        long length = 0;
        for (int entryId = 0; entryId < ENTRIES; entryId++) {
            length += payload(entryId).length;
            expect("add " + entryId, BKException.Code.OK, add(entryId, entryId - 1, length, 0));
        }
        ok("add", ENTRIES + " entries");
        for (int entryId = 0; entryId < ENTRIES; entryId++) {
            checkPayload("read " + entryId, entryId, read(entryId, 0, null));
        }
        ok("read", ENTRIES + " entries, digests checked");
        long lastLac = digests.verifyDigestAndReturnLastConfirmed(read(-1, 0, null)).getLastAddConfirmed();
        ok("read-last", "lac=" + lastLac);
        expect("read-unknown-ledger", BKException.Code.NoSuchLedgerExistsException,
                readRc(ledgerId + 1_000_000, 0));
        if (v2) {
            CompletableFuture<ByteBufList> batch = new CompletableFuture<>();
            int[] rc = new int[1];
            client.batchReadEntries(bookie, ledgerId, 2, 5, 1 << 20, (code, ledger, start, entries, ctx) -> {
                rc[0] = code;
                if (entries != null) {
                    entries.retain();
                }
                batch.complete(entries);
            }, null, 0);
            ByteBufList entries = batch.get(30, TimeUnit.SECONDS);
            expect("batch-read", BKException.Code.OK, rc[0]);
            for (int i = 0; i < entries.size(); i++) {
                checkPayload("batch-read " + (2 + i), 2 + i, entries.getBuffer(i));
            }
            ok("batch-read", entries.size() + " entries from 2");
        } else {
            CompletableFuture<ByteBuf> lac = new CompletableFuture<>();
            int[] rc = new int[1];
            client.readLac(bookie, ledgerId, (code, ledger, lacBody, lastEntry, ctx) -> {
                rc[0] = code;
                lac.complete(lastEntry == null ? null : lastEntry.retain());
            }, null);
            ByteBuf lastEntry = lac.get(30, TimeUnit.SECONDS);
            expect("read-lac", BKException.Code.OK, rc[0]);
            ok("read-lac", "lac=" + digests.verifyDigestAndReturnLastConfirmed(lastEntry).getLastAddConfirmed());

            CompletableFuture<Integer> writeLac = new CompletableFuture<>();
            client.writeLac(bookie, ledgerId, masterKey, ENTRIES - 1, digests.computeDigestAndPackageForSendingLac(
                    ENTRIES - 1), (code, ledger, addr, ctx) -> writeLac.complete(code), null);
            expect("write-lac", BKException.Code.OK, writeLac.get(30, TimeUnit.SECONDS));
            ok("write-lac", "lac=" + (ENTRIES - 1));

            CompletableFuture<Integer> force = new CompletableFuture<>();
            client.forceLedger(bookie, ledgerId, (code, ledger, addr, ctx) -> force.complete(code), null);
            expect("force-ledger", BKException.Code.OK, force.get(30, TimeUnit.SECONDS));
            ok("force-ledger", "");

            CompletableFuture<long[]> info = new CompletableFuture<>();
            int[] infoRc = new int[1];
            long wanted = BookkeeperProtocolFlags.TOTAL_DISK_CAPACITY | BookkeeperProtocolFlags.FREE_DISK_SPACE;
            client.getBookieInfo(bookie, wanted, (code, bookieInfo, ctx) -> {
                infoRc[0] = code;
                info.complete(bookieInfo == null ? null
                        : new long[] {bookieInfo.getFreeDiskSpace(), bookieInfo.getTotalDiskSpace()});
            }, null);
            long[] space = info.get(30, TimeUnit.SECONDS);
            expect("bookie-info", BKException.Code.OK, infoRc[0]);
            if (space[0] <= 0 || space[1] < space[0]) {
                throw new ProbeFailure("bookie-info free=" + space[0] + " total=" + space[1]);
            }
            ok("bookie-info", "free=" + space[0] + " total=" + space[1]);

            // The LAC (9, from WRITE_LAC) is past previousLAC 8: the answer piggybacks entry 9.
            CompletableFuture<ByteBuf> poll = new CompletableFuture<>();
            int[] pollRc = new int[1];
            client.readEntryWaitForLACUpdate(bookie, ledgerId, BookieProtocol.LAST_ADD_CONFIRMED, ENTRIES - 2, 5000,
                    true, (code, ledger, entry, buffer, ctx) -> {
                        pollRc[0] = code;
                        poll.complete(buffer == null ? null : buffer.retain());
                    }, null);
            ByteBuf polled = poll.get(30, TimeUnit.SECONDS);
            expect("long-poll", BKException.Code.OK, pollRc[0]);
            checkPayload("long-poll", ENTRIES - 1, polled);
            ok("long-poll", "piggybacked entry " + (ENTRIES - 1));
        }

        ByteBuf fenced = read(-1, BookieProtocol.FLAG_DO_FENCING, masterKey);
        ok("fence", "lac=" + digests.verifyDigestAndReturnLastConfirmed(fenced).getLastAddConfirmed());
        long next = length + payload(ENTRIES).length;
        expect("add-after-fence", BKException.Code.LedgerFencedException, add(ENTRIES, ENTRIES - 1, next, 0));
        ok("add-after-fence", "refused: fenced");
        expect("recovery-add", BKException.Code.OK,
                add(ENTRIES, ENTRIES - 1, next, BookieProtocol.FLAG_RECOVERY_ADD));
        checkPayload("read-recovered", ENTRIES, read(ENTRIES, 0, null));
        ok("recovery-add", "entry " + ENTRIES + " added and read back");
    }

    private static byte[] payload(long entryId) {
        return ("entry " + entryId + " of the interop probe").getBytes(StandardCharsets.UTF_8);
    }

    private int add(long entryId, long lac, long length, int flags) throws Exception {
        ReferenceCounted toSend = digests.computeDigestAndPackageForSending(entryId, lac, length,
                Unpooled.wrappedBuffer(payload(entryId)), masterKey, flags);
        CompletableFuture<Integer> done = new CompletableFuture<>();
        client.addEntry(bookie, ledgerId, masterKey, entryId, toSend,
                (rc, ledger, entry, addr, ctx) -> done.complete(rc), null, flags, false, WriteFlag.NONE);
        return done.get(30, TimeUnit.SECONDS);
    }

    private ByteBuf read(long entryId, int flags, byte[] key) throws Exception {
        int[] rc = new int[1];
        ByteBuf buffer = readWith(ledgerId, entryId, flags, key, rc);
        expect("read " + entryId, BKException.Code.OK, rc[0]);
        return buffer;
    }

    private int readRc(long ledger, long entryId) throws Exception {
        int[] rc = new int[1];
        readWith(ledger, entryId, 0, null, rc);
        return rc[0];
    }

    private ByteBuf readWith(long ledger, long entryId, int flags, byte[] key, int[] rc) throws Exception {
        CompletableFuture<ByteBuf> done = new CompletableFuture<>();
        client.readEntry(bookie, ledger, entryId, (code, l, e, buffer, ctx) -> {
            rc[0] = code;
            done.complete(buffer == null ? null : buffer.retain());
        }, null, flags, key);
        return done.get(30, TimeUnit.SECONDS);
    }

    private void checkPayload(String step, long entryId, ByteBuf entry) throws Exception {
        ByteBuf data = digests.verifyDigestAndReturnData(entryId, entry);
        byte[] bytes = new byte[data.readableBytes()];
        data.getBytes(data.readerIndex(), bytes);
        if (!Arrays.equals(bytes, payload(entryId))) {
            throw new ProbeFailure(step + ": payload differs: " + new String(bytes, StandardCharsets.UTF_8));
        }
    }

    private static void expect(String step, int wanted, int rc) {
        if (rc != wanted) {
            throw new ProbeFailure(step + ": rc " + rc + " (" + BKException.getMessage(rc) + "), expected " + wanted
                    + " (" + BKException.getMessage(wanted) + ")");
        }
    }

    private static void ok(String step, String details) {
        System.out.println("ok " + step + " " + details);
    }

    /** GetBookieInfoRequest.Flags, named here so the probe needs nothing but the public jars. */
    private static final class BookkeeperProtocolFlags {
        static final long TOTAL_DISK_CAPACITY = 1;
        static final long FREE_DISK_SPACE = 2;
    }

    private static final class ProbeFailure extends RuntimeException {
        ProbeFailure(String message) {
            super(message);
        }
    }
}
