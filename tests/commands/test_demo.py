"""`bookfleet demo` (what `make run` runs) end to end: fleet, auditor, repair runner, kill -9, healthy again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


def test_demo_reaches_a_verified_healthy_fleet():
    result = subprocess.run(
        [sys.executable, "-m", "bookfleet", "demo", "--exit-when-healthy", "--timeout", "90"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps at 80 columns without a terminal
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "Writing 20 ledgers of 50 x 1024 B (E=3, Qw=2, Qa=2)" in out
    assert "kill -9 bookie" in out and "ledgers under-replicated" in out
    assert "0 still marked, 0 failure(s)" in out
    assert "healthy: 20 ledgers, 1000 entries, each on its Qw=2 bookies, byte-identical" in out


def test_demo_names_a_bad_flag():
    result = subprocess.run(
        [sys.executable, "-m", "bookfleet", "demo", "--bookies", "3"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--bookies must be at least 4" in result.stderr
