"""bookfleet: a fleet of Python bookies that keeps every ledger fully replicated, and its Kubernetes operator."""

__version__ = "0.1.0"
