"""The history checker (hack/history-checker, porcupine) checks: known-bad histories of a single-writer
append-only ledger are rejected, each naming the entry it is about and drawing it, and known-good ones, with
unacknowledged adds, takeovers and recovery, are accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos import checker


@pytest.fixture(scope="module")
def built_checker() -> Path:
    try:
        return checker.checker_binary()
    except checker.CheckerUnavailable as exc:
        pytest.skip(str(exc))


class Script:
    """A history written by hand: operations at explicit times on one clock (t), as the harness records them."""

    def __init__(self):
        self.events: list[dict] = []
        self.ids = 0

    def op(self, process: str, f: str, call: int, ret: int | None, ledger: int = 1, told: dict | None = None,
           **fields: object) -> None:
        self.ids += 1
        op_id = f"{process}-{self.ids}"
        self.events.append({"type": "invoke", "id": op_id, "process": process, "t": call, "f": f, "ledger": ledger,
                            **fields})
        if ret is not None:
            self.events.append({"type": "ok", "id": op_id, "process": process, "t": ret, **(told or {})})

    def add(self, process: str, entry: int, payload: str, call: int, ret: int | None) -> None:
        self.op(process, "add", call, ret, entry=entry, digest=payload, told={"entry": entry, "digest": payload})

    def read(self, process: str, entry: int, call: int, ret: int, payload: str | None) -> None:
        told = {"digest": payload} if payload is not None else {"missing": True}
        self.op(process, "read", call, ret, entry=entry, told=told)

    def close(self, process: str, last: int, call: int, ret: int, f: str = "close") -> None:
        self.op(process, f, call, ret, told={"last": last})

    def check(self, tmp_path: Path) -> checker.Verdict:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "history.jsonl"
        path.write_text("".join(json.dumps(event) + "\n" for event in reversed(self.events)))  # any order
        return checker.check([path], tmp_path / "html")


def writer_then_recovery() -> Script:
    """Writer w1 acks 0..2, its add of 3 is never acknowledged, a reader reads 1, recovery closes at 2."""
    s = Script()
    for e in range(3):
        s.add("w1", e, f"a{e}", 10 * e, 10 * e + 5)
    s.add("w1", 3, "a3", 30, None)
    s.read("r", 1, 12, 20, "a1")
    s.close("recovery", 2, 40, 50)
    for e in range(3):
        s.read("final", e, 60 + e, 61 + e, f"a{e}")
    return s


def test_known_good_histories_are_accepted(built_checker, tmp_path):
    verdict = writer_then_recovery().check(tmp_path / "recovery")
    assert verdict.legal, verdict.figures
    assert verdict.figures["acknowledged"] == 3 and verdict.figures["partitions"] == 4

    takeover = Script()  # w1 stops after 0..1; w2 reopens at 1 and writes 2 itself; w1's unacked 2 is cut off
    takeover.add("w1", 0, "a0", 0, 5)
    takeover.add("w1", 1, "a1", 6, 9)
    takeover.add("w1", 2, "a2", 8, None)
    takeover.close("w2", 1, 20, 25, f="reopen")
    takeover.add("w2", 2, "b2", 26, 30)
    takeover.close("w2", 2, 31, 35)
    takeover.read("final", 2, 40, 41, "b2")
    verdict = takeover.check(tmp_path / "takeover")
    assert verdict.legal, verdict.figures

    kept = Script()  # an add never acknowledged that recovery found and kept: readable with its payload
    kept.add("w1", 0, "a0", 0, 5)
    kept.add("w1", 1, "a1", 6, None)
    kept.close("recovery", 1, 20, 25)
    kept.read("final", 1, 30, 31, "a1")
    verdict = kept.check(tmp_path / "kept")
    assert verdict.legal, verdict.figures


def overwritten_entry() -> Script:
    """A paused writer comes back after another writer took the ledger over and overwrites its entry 1."""
    s = Script()
    s.add("w1", 0, "a0", 0, 5)
    s.add("w1", 1, "a1", 6, 100)  # sent before the pause, acknowledged after it
    s.close("w2", 0, 20, 25, f="reopen")
    s.add("w2", 1, "b1", 26, 30)
    return s


def closed_short() -> Script:
    s = Script()
    for e in range(3):
        s.add("w1", e, f"a{e}", 10 * e, 10 * e + 5)
    s.close("recovery", 1, 40, 50)
    return s


def two_payloads_for_one_id() -> Script:
    """Two writers' adds of entry 0, neither acknowledged; readers are shown both payloads."""
    s = Script()
    s.add("w1", 0, "a0", 0, None)
    s.add("w2", 0, "b0", 1, None)
    s.read("r1", 0, 10, 11, "a0")
    s.read("r2", 0, 20, 21, "b0")
    return s


def read_past_the_lac() -> Script:
    """A reader is shown entry 1 before it was acknowledged, and recovery then closes the ledger at 0."""
    s = Script()
    s.add("w1", 0, "a0", 0, 5)
    s.add("w1", 1, "a1", 6, None)
    s.read("r", 1, 10, 11, "a1")
    s.close("recovery", 0, 20, 25)
    return s


def acknowledged_entry_lost() -> Script:
    s = writer_then_recovery()
    s.read("final", 1, 90, 91, None)
    return s


@pytest.mark.parametrize(
    "history, entry",
    [
        (overwritten_entry, 1),
        (closed_short, 2),
        (two_payloads_for_one_id, 0),
        (read_past_the_lac, 1),
        (acknowledged_entry_lost, 1),
    ],
)
def test_known_bad_histories_are_rejected(built_checker, tmp_path, history, entry):
    verdict = history().check(tmp_path)
    assert verdict.verdict == "illegal", verdict.figures
    assert verdict.figures["violations"] == [f"ledger 1 entry {entry}"]
    (drawn,) = verdict.figures["visualization"]
    assert Path(drawn).name == f"ledger-1-entry-{entry}.html" and Path(drawn).stat().st_size > 1000


def test_a_malformed_history_is_refused(built_checker, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"type": "invoke", "id": "x", "process": "w", "t": 1, "f": "append", "ledger": 1}\n')
    with pytest.raises(RuntimeError, match=r"unknown kind .append."):
        checker.check([path], tmp_path / "html")
