"""The ZooKeeper model shared by bookies, clients, auto-recovery and the operator: connect, paths, ledger metadata,
the bookie registry, bookie state switches, cookies, under-replication markers. It depends on nothing above it."""
