"""What the main module registers with kopf (the loops themselves: test_wakeups.py; end to end: test_operator.py)."""

from __future__ import annotations

import kopf

from bookfleet.kube import handlers


def test_the_operator_lists_its_resources_in_pages_at_start_up():
    """kopf's first LIST of each resource it watches (BookieClusters, Bookies) is paginated, as the informers' are."""
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert settings.watching.chunk_size is not None and 0 < settings.watching.chunk_size <= 1000


def test_no_loop_puts_a_finalizer_on_its_object():
    """A finalizer outlives the operator that should release it: `kubectl delete namespace` and an Argo CD prune
    delete the operator with the BookieClusters and Bookies, which stayed Terminating for ever under kopf's."""
    daemons = kopf.get_default_registry()._spawning.get_all_handlers()
    assert {daemon.fn for daemon in daemons} >= {handlers.run_cluster, handlers.run_bookie}
    assert not [daemon.id for daemon in daemons if daemon.requires_finalizer]
