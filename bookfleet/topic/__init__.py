"""Partitioned topics stored as ordered sequences of ledgers, addressed by MessageId."""
