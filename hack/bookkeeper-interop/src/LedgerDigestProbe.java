import java.nio.charset.StandardCharsets;
import java.util.Enumeration;
import java.util.HexFormat;

import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

/**
 * Apache BookKeeper's own ledger client on a bookfleet fleet, for the digest interop tests: it writes a ledger with a
 * given digest type and password, or reads one whole, checking every entry's digest as BookKeeper does.
 *
 * <p>{@code LedgerDigestProbe METADATA_URI write DIGEST PASSWORD ENTRIES}: creates a ledger (E3, Qw2, Qa2), adds
 * ENTRIES entries whose payloads are {@code payload(i)}, closes it and prints {@code ledger ID}.
 *
 * <p>{@code LedgerDigestProbe METADATA_URI read LEDGER DIGEST PASSWORD [LEDGER DIGEST PASSWORD ...]}: for each
 * ledger in turn, prints {@code reading LEDGER}, opens it (recovery open) with digest type autodetection off, so the
 * digest type the metadata names must be DIGEST, reads every entry and prints {@code entry ID HEX} for each, then
 * {@code last ID}: several ledgers in one JVM, whose start costs more than the reads. Any failure is an exception and
 * a non-zero exit.
 */
public final class LedgerDigestProbe {
    private LedgerDigestProbe() {
    }

    static byte[] payload(long entryId) {
        return ("java entry " + entryId + " ").repeat((int) (entryId % 5) + 1).getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5 || (args[1].equals("write") ? args.length != 5 : (args.length - 2) % 3 != 0)) {
            System.err.println("usage: LedgerDigestProbe METADATA_URI write DIGEST PASSWORD ENTRIES"
                    + " | LedgerDigestProbe METADATA_URI read LEDGER DIGEST PASSWORD [LEDGER DIGEST PASSWORD ...]");
            System.exit(2);
        }
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(args[0]);
        conf.setEnableDigestTypeAutodetection(false);
        conf.setAddEntryTimeout(30);
        conf.setReadEntryTimeout(30);
        try (BookKeeper bookKeeper = new BookKeeper(conf)) {
            if (args[1].equals("write")) {
                write(bookKeeper, BookKeeper.DigestType.valueOf(args[2]), password(args[3]), Integer.parseInt(args[4]));
            } else {
                for (int at = 2; at < args.length; at += 3) {
                    read(bookKeeper, Long.parseLong(args[at]), BookKeeper.DigestType.valueOf(args[at + 1]),
                            password(args[at + 2]));
                }
            }
        }
    }

    private static byte[] password(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    private static void write(BookKeeper bookKeeper, BookKeeper.DigestType digest, byte[] password, int entries)
            throws Exception {
        LedgerHandle ledger = bookKeeper.createLedger(3, 2, 2, digest, password);
        for (long entryId = 0; entryId < entries; entryId++) {
            ledger.addEntry(payload(entryId));
        }
        ledger.close();
        System.out.println("ledger " + ledger.getId());
    }

    private static void read(BookKeeper bookKeeper, long ledgerId, BookKeeper.DigestType digest, byte[] password)
            throws Exception {
        System.out.println("reading " + ledgerId);
        LedgerHandle ledger = bookKeeper.openLedger(ledgerId, digest, password);
        long last = ledger.getLastAddConfirmed();
        if (last >= 0) {
            Enumeration<LedgerEntry> entries = ledger.readEntries(0, last);
            while (entries.hasMoreElements()) {
                LedgerEntry entry = entries.nextElement();
                System.out.println("entry " + entry.getEntryId() + " " + HexFormat.of().formatHex(entry.getEntry()));
            }
        }
        ledger.close();
        System.out.println("last " + last);
    }
}
