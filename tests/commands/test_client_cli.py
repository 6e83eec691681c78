"""`bookfleet ledger ...` and `bookfleet bookies list` through cli.main against real ZooKeeper and bookies."""

from __future__ import annotations

import io
import json
import sys

import pytest

from bookfleet import cli


def run(capsys, *argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ledger_lifecycle_and_clear_errors(bookie_fleet, zk_connect, capsys, monkeypatch):
    bookie_fleet.start(3, zones=["a", "b"])
    zk = ("--zk", zk_connect)

    code, out, _ = run(capsys, "bookies", "list", "--json", *zk)
    bookies = json.loads(out)
    assert code == 0 and sorted(b["zone"] for b in bookies) == ["a", "a", "b"]

    code, out, _ = run(capsys, "ledger", "create", "-e", "3", "-w", "3", "-a", "2", "--password", "pw", *zk)
    assert code == 0
    ledger = out.strip()

    code, out, _ = run(
        capsys, "ledger", "write", ledger, "--password", "pw", *zk, stdin=b"a\nb\nc\n", monkeypatch=monkeypatch
    )
    assert (code, out.strip()) == (0, f"wrote 3 entries to ledger {ledger} (0..2)")
    code, out, _ = run(capsys, "ledger", "write", ledger, "--count", "2", "--size", "4", "--password", "pw", *zk)
    assert (code, out.strip()) == (0, f"wrote 2 entries to ledger {ledger} (3..4)")

    code, out, _ = run(capsys, "ledger", "read", ledger, "--password", "pw", *zk)
    assert (code, out.split()) == (0, ["a", "b", "c", "0000", "0001"])
    code, out, _ = run(capsys, "ledger", "read", ledger, "--from", "1", "--to", "2", "--json", "--password", "pw", *zk)
    assert [json.loads(line)["payload"] for line in out.splitlines()] == ["b", "c"]

    code, out, _ = run(capsys, "ledger", "close", ledger, "--json", "--password", "pw", *zk)
    closed = json.loads(out)
    assert (closed["state"], closed["last_entry_id"], closed["length"]) == ("CLOSED", 4, 11)
    code, out, _ = run(capsys, "ledger", "info", ledger, *zk)
    assert f"ledger {ledger}: CLOSED, last entry 4, length 11" in out and "from entry 0: " in out
    code, out, _ = run(capsys, "ledger", "list", "--json", *zk)
    assert json.loads(out) == [int(ledger)]

    errors = {
        ("ledger", "write", ledger, "--count", "1", "--password", "pw"): f"ledger {ledger} is closed",
        ("ledger", "read", ledger, "--to", "9", "--password", "pw"): f"entry 9 of ledger {ledger} is beyond",
        ("ledger", "read", ledger): f"wrong password for ledger {ledger}",
        ("ledger", "info", "4242"): "ledger 4242 does not exist",
        ("ledger", "create", "-e", "4"): "need 4 writable bookies, 3 available: localhost:",
        ("ledger", "create", "-e", "2", "-w", "3"): "E=2 Qw=3 Qa=2",
    }
    for argv, message in errors.items():
        code, _, err = run(capsys, *argv, *zk)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)

    code, out, _ = run(capsys, "ledger", "delete", ledger, *zk)
    assert code == 0
    code, _, err = run(capsys, "ledger", "recover", ledger, *zk)
    assert code == 2 and f"ledger {ledger} does not exist" in err


def test_arguments_are_checked_before_anything_runs(capsys, monkeypatch):
    monkeypatch.delenv("BOOKFLEET_ZK", raising=False)
    with pytest.raises(SystemExit):
        cli.main(["ledger", "read", "abc"])
    assert "ledger id must be a non-negative integer, got 'abc'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["ledger", "info", "-5", "--zk", "127.0.0.1:1"])
    code, _, err = run(capsys, "ledger", "list")
    assert code == 2 and "no ZooKeeper given" in err
