"""What the main module registers with kopf (the loops themselves: test_wakeups.py; end to end: test_operator.py)."""

from __future__ import annotations

import kopf

from bookfleet.kube import handlers


def test_the_operator_lists_its_resources_in_pages_at_start_up():
    """kopf's first LIST of each resource it watches (BookieClusters, Bookies) is paginated, as the informers' are."""
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert settings.watching.chunk_size is not None and 0 < settings.watching.chunk_size <= 1000
