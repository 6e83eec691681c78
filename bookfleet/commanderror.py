"""`CommandError`: a user error that `bookfleet` reports as one clear line and a non-zero exit.

Its own module, below the commands and the benchmarks that raise it, so nothing has to import `bookfleet.cli`
(the entry point, which sits above every command it discovers).
"""


class CommandError(Exception):
    """An error to report as one clear line and a non-zero exit."""
