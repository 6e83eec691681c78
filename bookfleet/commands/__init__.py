"""Subcommands of `bookfleet`: each module defines `register(subparsers)` and sets `handler` on its parsers."""
