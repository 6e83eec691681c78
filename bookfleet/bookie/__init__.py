"""The bookie: a storage engine (journal, memtable, entry log, index, checkpoint, GC) and its TCP server."""
