"""Benchmarks: each module defines `register(subparsers)` for one `bookfleet bench NAME` and prints JSON."""
