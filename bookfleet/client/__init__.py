"""The ledger client side: bookie connections, metadata, placement, writers and readers."""
