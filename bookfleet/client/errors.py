"""What a ledger writer raises: an add or close that cannot succeed (the writer, its ensemble change and the
facade share them)."""

class LedgerWriteError(Exception):
    """An add or close that cannot succeed; the message names the ledger and why."""


class LedgerFencedError(LedgerWriteError):
    """Another client opened the ledger for recovery, or reopened it as its writer: this writer may no longer add."""


class LedgerClosedError(LedgerWriteError):
    pass


class LedgerHeldError(LedgerWriteError):
    """Another live writer holds the ledger's writer lease."""


class EntryTooLargeError(LedgerWriteError):
    """One entry larger than a bookie accepts; refused before sending (the ledger and its connections go on)."""
