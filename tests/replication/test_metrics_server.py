"""The repair counters served from a repair's own process (its pod on Kubernetes): a driver that something scrapes
waits for one more scrape after its run, so its last counts reach Prometheus; one nothing scrapes ends at once."""

from __future__ import annotations

import threading
import urllib.request

from prometheus_client import REGISTRY

from bookfleet.replication.metricsserver import MetricsServer, served
from bookfleet.replication.spark_repair import REPAIRED_ENTRIES


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_a_scraped_run_lingers_until_the_scrape_after_its_end_has_its_last_counts():
    server = MetricsServer(0, "127.0.0.1")
    try:
        assert "bookfleet_repair_entries_total" in scrape(server.port)  # a scraper is there during the run
        REPAIRED_ENTRIES.inc(5)  # the run's last copies
        final = REGISTRY.get_sample_value("bookfleet_repair_entries_total")
        lingered: list[bool] = []
        waiting = threading.Thread(target=lambda: lingered.append(server.linger(600)))
        waiting.start()
        while waiting.is_alive():  # the scrapes go on, as Prometheus' do, until one comes after the linger began
            text = scrape(server.port)
            waiting.join(0.05)
        assert lingered == [True]
        assert f"bookfleet_repair_entries_total {final}" in text
    finally:
        server.close()


def test_a_run_nothing_scraped_does_not_linger():
    server = MetricsServer(0, "127.0.0.1")
    try:
        assert server.linger(600) is False  # returns at once: no scraper, nothing to wait for
    finally:
        server.close()
    assert served(None, 600, lambda: "summary") == "summary"  # no port: not served at all
