"""The one act step: decided actions are applied in order, and a status patch calls the API only on a change."""

from __future__ import annotations

from typing import Any

from bookfleet.kube.actions import Delete, Ensure, Patch, PatchStatus, PostEvent, act
from bookfleet.kube.context import OperatorContext


class RecordingApi:
    """Records the calls the actions make, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def ensure(self, manifest: dict) -> tuple[dict, bool]:
        self.calls.append(("ensure", manifest["metadata"]["name"]))
        return manifest, True

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict) -> None:
        self.calls.append(("patch", plural, name, patch))

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> bool:
        self.calls.append(("delete", plural, name))
        return True

    def patch_status(self, plural: str, namespace: str, name: str, status: dict) -> None:
        self.calls.append(("status", plural, name, status))

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        self.calls.append(("event", involved["metadata"]["name"], reason, warning))


BODY = {"metadata": {"name": "bk-0", "namespace": "ns"}, "status": {"phase": "Running"}}


def test_actions_are_applied_in_the_decided_order() -> None:
    api = RecordingApi()
    body = {**BODY}
    act(OperatorContext(api), body, [  # type: ignore[arg-type]
        PatchStatus("bookies", {"phase": "Lost"}),
        Delete("v1", "pods", "ns", "bk-0"),
        Ensure({"metadata": {"name": "bk-0-journal"}}),
        Patch("v1", "pods", "ns", "bk-1", {"metadata": {"labels": {"a": "b"}}}),
        PostEvent("BookieLost", "pod bk-0 is gone", warning=True),
        PostEvent("Decommissioned", "bk-1 removed", involved={"metadata": {"name": "cluster"}}),
    ])
    assert api.calls == [
        ("status", "bookies", "bk-0", {"phase": "Lost"}),
        ("delete", "pods", "bk-0"),
        ("ensure", "bk-0-journal"),
        ("patch", "pods", "bk-1", {"metadata": {"labels": {"a": "b"}}}),
        ("event", "bk-0", "BookieLost", True),
        ("event", "cluster", "Decommissioned", False),
    ]
    assert body["status"] == {"phase": "Lost"}


def test_an_unchanged_status_makes_no_api_call() -> None:
    api = RecordingApi()
    act(OperatorContext(api), {**BODY}, [PatchStatus("bookies", {"phase": "Running"})])  # type: ignore[arg-type]
    assert api.calls == []


def test_actions_compare_as_values() -> None:
    """decide() tests compare decided lists: equal actions are equal values."""
    assert [Delete("v1", "pods", "ns", "bk-0"), PostEvent("R", "m")] == [Delete("v1", "pods", "ns", "bk-0"),
                                                                         PostEvent("R", "m")]
