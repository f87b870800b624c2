"""Process and server faults, one run each (the short nemesis run).

A worker SIGKILLed with its pool and started again; a worker SIGSTOPped
for 2.5 leases, then SIGCONT (a GC pause, swap, a frozen VM); the server
killed with ``kill -9`` and restarted on its AOF (``appendfsync everysec``
and ``always``); Dramatiq's worker stopped too. See docs/reliability.md.
"""

from __future__ import annotations

import pytest

# Once: the faults hit the workers and the network, whose server side the
# rest of the suite runs on Redis 7 too.
pytestmark = [pytest.mark.slow, pytest.mark.once]


def test_protean_worker_sigkilled(nemesis):
    nemesis("protean", "sigkill-worker")


def test_celery_worker_stopped_longer_than_its_lease(nemesis):
    nemesis("celery", "sigstop-worker")


def test_taskiq_server_killed_with_aof_everysec(nemesis):
    nemesis("taskiq", "server-kill-9-aof-everysec")


def test_protean_server_killed_with_aof_always(nemesis):
    nemesis("protean", "server-kill-9-aof-always")


def test_dramatiq_worker_stopped_longer_than_its_lease(nemesis):
    nemesis("dramatiq", "sigstop-worker")
