"""The first hour with the CLI: quiet output, `status`, `underreplicated`, `autorecovery`, open-ledger `info`."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

from bookfleet import cli
from bookfleet.commands.status import bookie_table
from bookfleet.meta.fleetstatus import BookieAtAGlance
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.replication.auditor import Auditor


def bookfleet(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The CLI as a user runs it: its own process, so the logging set-up is the real one."""
    return subprocess.run(
        [sys.executable, "-m", "bookfleet", *argv], input=stdin, capture_output=True, text=True, timeout=120
    )


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_commands_print_only_their_output_and_one_error_line(zk, zk_connect):
    zk.ensure_path("/ledgers")
    listing = bookfleet("ledger", "list", "--zk", zk_connect)
    assert (listing.returncode, listing.stdout, listing.stderr) == (0, "\n", "")

    missing = bookfleet("ledger", "read", "999", "--zk", zk_connect)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == "bookfleet ledger: ledger 999 does not exist\n"

    unreachable = bookfleet("status", "--zk", "127.0.0.1:1")
    assert unreachable.returncode == 2 and unreachable.stdout == ""
    assert unreachable.stderr.splitlines() == [
        "bookfleet status: ZooKeeper at 127.0.0.1:1 is unreachable (no session within 10s)"
    ]

    verbose = bookfleet("-v", "ledger", "list", "--zk", zk_connect)
    assert verbose.returncode == 0 and "INFO kazoo.client: Connecting to" in verbose.stderr

    watch = subprocess.Popen(
        [sys.executable, "-m", "bookfleet", "status", "--watch", "0.2", "--json", "--zk", zk_connect],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        first, second = (json.loads(watch.stdout.readline()) for _ in range(2))
    finally:
        watch.kill()
        watch.wait()
    assert first["healthy"] and second["taken_at"] > first["taken_at"]

    assert bookfleet("--version").stdout == f"bookfleet {version('bookfleet')}\n"
    completion = bookfleet("--print-completion", "bash")
    assert completion.returncode == 0 and "underreplicated" in completion.stdout and "autorecovery" in completion.stdout


def test_info_of_an_open_ledger_shows_what_its_bookies_report(bookie_fleet, zk_connect, capsys):
    bookies = bookie_fleet.start(3)
    zk = ("--zk", zk_connect)
    _, out, _ = run(capsys, "ledger", "create", "--password", "pw", *zk)
    ledger = out.strip()
    assert run(capsys, "ledger", "write", ledger, "--count", "2", "--size", "5", "--password", "pw", *zk)[0] == 0

    code, out, _ = run(capsys, "ledger", "info", ledger, "--json", "--password", "pw", *zk)
    info = json.loads(out)
    assert code == 0
    assert (info["state"], info["last_entry_id"], info["length"]) == ("OPEN", -1, 0)  # the metadata's own fields
    assert info["bookies_report"] == {"last_add_confirmed": 1, "last_entry_stored": 1, "length": 10}

    code, out, _ = run(capsys, "ledger", "info", ledger, "--password", "pw", *zk)
    assert out.splitlines()[:2] == [
        f"ledger {ledger}: OPEN (the metadata's last entry and length are set at close)",
        "  bookies report: last confirmed entry 1, length 10",
    ]
    code, out, _ = run(capsys, "ledger", "info", ledger, *zk)  # the length needs the digest, so the password
    assert "bookies report: last confirmed entry 1, length unknown (wrong password for ledger" in out

    bookies[0].stop()  # a replica down: the others still answer for the LAC and the entry
    code, out, _ = run(capsys, "ledger", "info", ledger, "--json", "--password", "pw", *zk)
    assert json.loads(out)["bookies_report"] == {"last_add_confirmed": 1, "last_entry_stored": 1, "length": 10}
    for bookie in bookies[1:]:
        bookie.stop()
    code, out, _ = run(capsys, "ledger", "info", ledger, "--password", "pw", *zk)
    assert code == 0 and f"  bookies report: nothing (no bookie of ledger {ledger} answered for its LAC" in out
    for bookie in bookies:
        bookie.start().wait_ready()

    run(capsys, "ledger", "close", ledger, "--password", "pw", *zk)
    code, out, _ = run(capsys, "ledger", "info", ledger, "--json", *zk)
    closed = json.loads(out)
    assert (closed["state"], closed["last_entry_id"], closed["length"]) == ("CLOSED", 1, 10)
    assert "bookies_report" not in closed


def test_status_of_a_live_fleet(bookie_fleet, zk, zk_connect, capsys):
    bookies = bookie_fleet.start(3, zones=["a", "b", "c"])
    flag = ("--zk", zk_connect)
    ids = []
    for _ in range(3):
        _, out, _ = run(capsys, "ledger", "create", *flag)
        ids.append(int(out))
    run(capsys, "ledger", "write", str(ids[0]), "--count", "3", *flag)
    run(capsys, "ledger", "close", str(ids[1]), *flag)
    under_replication = UnderReplication(zk)
    under_replication.mark(ids[0], ["gone-bookie"])
    under_replication.acquire(ids[0], "repair:test")
    under_replication.mark_data_loss(ids[2], [0])

    assert run(capsys, "autorecovery", "disable", *flag)[0] == 0
    assert run(capsys, "autorecovery", "delay", "30", *flag)[0] == 0
    code, _, err = run(capsys, "autorecovery", "delay", "-1", *flag)
    assert code == 2 and "the delay must be whole seconds >= 0, got -1" in err
    stopped = bookies[2]
    stopped.stop()

    with Auditor(zk, "auditor-under-test") as auditor:
        wait_for(lambda: auditor.is_active, 60, "the auditor to take office")

        def status() -> dict:
            code, out, _ = run(capsys, "status", "--json", *flag)
            assert code == 0
            return json.loads(out)

        def deregistered() -> dict | None:
            fleet = status()
            by_id = {bookie["bookie_id"]: bookie for bookie in fleet["bookies"]}
            return (fleet, by_id) if by_id[stopped.bookie_id]["state"] == "absent" else None

        fleet, by_id = wait_for(deregistered, 60, "the stopped bookie to deregister", interval=0.5)
        assert by_id[stopped.bookie_id]["state"] == "absent" and by_id[stopped.bookie_id]["ledgers"] == 3
        for running in bookies[:2]:
            bookie = by_id[running.bookie_id]
            assert bookie["state"] == "writable" and bookie["ledgers"] == 3 and bookie["free_bytes"] > 0
            assert bookie["zone"] in ("a", "b")
        assert fleet["ledgers"] == {  # by default no read per ledger: the states are not counted
            "total": 3, "open": None, "in_recovery": None, "closed": None, "under_replicated": 1, "data_loss": 1
        }
        code, out, _ = run(capsys, "status", "--json", "--by-state", *flag)
        assert json.loads(out)["ledgers"] == {
            "total": 3, "open": 2, "in_recovery": 0, "closed": 1, "under_replicated": 1, "data_loss": 1
        }
        assert fleet["data_loss_ledgers"] == [ids[2]]
        assert fleet["auditor"] == {
            "active": "auditor-under-test", "standbys": 0, "recovery_delay_s": 30.0, "replication_disabled": True
        }
        assert [(r["holder"], r["ledgers_left"]) for r in fleet["repairs"]] == [("repair:test", 1)]
        assert fleet["healthy"] is False

        code, out, _ = run(capsys, "status", *flag)
        assert code == 0 and "fleet DATA LOSS" in out and "replication DISABLED" in out
        assert "ledgers: 3; 1 under-replicated, 1 data loss" in out
        code, out, _ = run(capsys, "status", "--by-state", *flag)
        assert "ledgers: 3 (2 open, 0 in recovery, 1 closed); 1 under-replicated, 1 data loss" in out
        assert "repair: repair:test: 1 ledger(s) left" in out and "auditor: auditor-under-test;" in out

    code, out, _ = run(capsys, "underreplicated", "list", "--json", *flag)
    [marked] = json.loads(out)
    assert (marked["ledger_id"], marked["missing_bookies"], marked["repair_holder"]) == (
        ids[0], ["gone-bookie"], "repair:test"
    )
    code, out, _ = run(capsys, "underreplicated", "list", *flag)
    assert out.startswith(f"{ids[0]}\tmissing: gone-bookie\tsince ") and "repairing: repair:test" in out

    assert run(capsys, "autorecovery", "enable", *flag)[0] == 0
    code, out, _ = run(capsys, "autorecovery", "status", "--json", *flag)
    assert json.loads(out)["replication_disabled"] is False and not under_replication.is_disabled()


def test_an_unexpected_failure_is_one_line_and_exit_1(capsys, monkeypatch):
    def broken(args) -> int:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("bookfleet.commands.autorecovery.run_status", broken)
    code, out, err = run(capsys, "autorecovery", "status", "--zk", "127.0.0.1:1")
    assert (code, out) == (1, "")
    assert err == "bookfleet autorecovery: unexpected RuntimeError: disk on fire (--log-level DEBUG shows where)\n"


def test_the_bookie_table_aligns_its_columns_and_colours_only_the_state():
    """The table is lines of one Text (rich's Table was most of `status` at 1,000 bookies): columns two spaces
    apart, free space and ledgers right-aligned, a forced read-only bookie says so, the state alone coloured."""
    bookies = [
        BookieAtAGlance(bookie_id="bookie-10:3181", state="writable", zone="a", free_bytes=2_000_000, ledgers=120),
        BookieAtAGlance(bookie_id="b2:3181", state="read_only", zone="b", free_bytes=0, ledgers=7,
                        forced_read_only="draining"),
        BookieAtAGlance(bookie_id="gone:3181", state="absent", ledgers=3),
    ]
    table = bookie_table(bookies)
    assert table.plain.splitlines() == [
        "bookie          state               zone     free  ledgers",
        "bookie-10:3181  writable            a      2.0 MB      120",
        "b2:3181         read-only (forced)  b     0 bytes        7",
        "gone:3181       absent              -           -        3",
    ]
    coloured = {table.plain[span.start:span.end]: span.style for span in table.spans}
    assert coloured == {"read-only (forced)": "yellow", "absent            ": "red"}


def test_a_command_registers_alone_and_anything_else_gets_every_command():
    """`bookfleet status` imports only its own module (not the bookie or Spark's jobs), also after `--log-level`'s
    value (as a fleet starts its bookies); a word that names no module (`operator` lives in kube_operator, another
    option's value) or none registers every command."""
    probe = ("import sys; from bookfleet import cli; parser = cli.build_parser(cli.first_word(sys.argv[1:])); "
             "print(sorted(parser._subparsers._group_actions[0].choices), 'aiohttp' in sys.modules)")

    def registered(*argv: str) -> str:
        return subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60,
                              check=True).stdout.strip()
    assert registered("status", "--zk", "h:1") == "['status'] False"
    assert registered("-v", "delete-cluster") == "['delete-cluster'] False"
    assert registered("--log-level", "INFO", "bookie") == "['bookie'] False"
    for argv in (["operator"], ["--print-completion", "bash"], []):
        every = registered(*argv)
        assert "'operator'" in every and "'status'" in every and "'bookie'" in every, argv
