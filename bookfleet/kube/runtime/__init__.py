"""What the reconcilers run on, knowing none of them: the Kubernetes API client (`api`), a pass's context and
ZooKeeper sessions (`context`), `metrics`, list-then-watch `informers`, the loops' `wakeups`, the Ledger feed."""
