"""The reconcilers: one module per kind (`bookies`, `clusters`, `ledgers`), each observe -> decide (pure) -> act, and
the parts they share (`actions`: the act step; `repairs`, `certificates`, `autoscaler`, `ledgerscan`, `teardown`)."""
