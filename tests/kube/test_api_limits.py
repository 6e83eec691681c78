"""The operator's side of API priority and fairness (kube/runtime/api.py): a client-side token bucket on every request,
and a 429 Too Many Requests waited out (its Retry-After) and sent again rather than failing the pass."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from bookfleet.kube.runtime.api import THROTTLED_RETRIES, KubeApi, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Answer:
    """What the kubernetes client's call_api returns, as far as KubeApi reads it."""

    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None):
        self.status, self.reason, self.headers, self._data = status, "", headers or {}, json.dumps(body).encode()

    def read(self) -> bytes:
        return self._data


class ScriptedClient:
    """An ApiClient that answers each request with the next of `answers`."""

    def __init__(self, answers: list[Answer]):
        self.answers, self.sent = answers, 0

    def param_serialize(self, method: str, path: str, **_: object) -> tuple:
        return method, path

    def call_api(self, *request: object, **_: object) -> Answer:
        self.sent += 1
        return self.answers.pop(0)


def test_the_bucket_lets_a_burst_through_then_spaces_requests_at_the_rate():
    clock = Clock()
    bucket = RateLimiter(qps=10, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(5)] == pytest.approx([0, 0, 0, 0.1, 0.2])
    clock.now = 10.0  # idle long enough to refill, but never beyond the burst
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0, 0, 0, 0.1])


def test_every_request_of_a_limited_client_waits_for_its_token():
    waits: list[float] = []
    api = KubeApi(ScriptedClient([Answer(200, {"items": []}) for _ in range(4)]),
                  limiter=RateLimiter(qps=5, burst=2, clock=Clock()), sleep=waits.append)
    for _ in range(4):
        api.list("v1", "pods", "default")
    assert waits == pytest.approx([0, 0, 0.2, 0.4])


def test_a_throttled_request_is_sent_again_after_the_retry_after_the_server_named():
    waits: list[float] = []
    client = ScriptedClient([Answer(429, {}, {"Retry-After": "3"}), Answer(429, {}), Answer(200, {"items": [1]})])
    assert KubeApi(client, sleep=waits.append).list("v1", "pods", "default") == [1]
    assert waits == [3.0, 2.0] and client.sent == 3  # the second named none: 2 s, the backoff of attempt 1


def test_a_request_throttled_every_time_fails_after_a_few_attempts():
    client = ScriptedClient([Answer(429, {}, {"Retry-After": "1"}) for _ in range(THROTTLED_RETRIES + 1)])
    with pytest.raises(ApiException) as raised:
        KubeApi(client, sleep=lambda seconds: None).get("v1", "pods", "default", "bk-0")
    assert raised.value.status == 429 and client.sent == THROTTLED_RETRIES + 1
