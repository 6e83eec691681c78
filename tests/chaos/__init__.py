"""The history chaos harness: writer processes record a client history while faults are injected, and the
porcupine checker under hack/history-checker decides whether it is legal (tests/chaos/test_chaos_history.py)."""
