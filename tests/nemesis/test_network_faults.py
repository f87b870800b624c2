"""Network faults, one run each (the short nemesis run; ``make nemesis`` for three of each).

Through the fault proxy between each client and the server: a worker
blackholed alone (no RST) for 2.5 leases, every client blackholed both
ways, requests only or replies only, every connection reset and new ones
refused, 0.3 s of latency each way, and issue 42's partition of 20 s
against the default 10 s lease. docs/reliability.md has what each one
found on every workload.
"""

from __future__ import annotations

import pytest

# Once: the faults hit the workers and the network, whose server side the
# rest of the suite runs on Redis 7 too.
pytestmark = [pytest.mark.slow, pytest.mark.once]


def test_taskiq_worker_blackholed_alone_longer_than_its_lease(nemesis):
    nemesis("taskiq", "blackhole-one-worker")


def test_queue_all_clients_blackholed(nemesis):
    nemesis("queue", "blackhole-all")


def test_taskiq_replies_blackholed(nemesis):
    nemesis("taskiq", "blackhole-all-to-client")


def test_taskiq_every_connection_reset_and_refused(nemesis):
    nemesis("taskiq", "reset-and-refuse")


def test_queue_latency(nemesis):
    nemesis("queue", "latency-0.3s")


def test_dramatiq_requests_blackholed(nemesis):
    nemesis("dramatiq", "blackhole-all-to-server")


def test_celery_partition_longer_than_the_default_lease(nemesis):
    # Issue 42's setting: 20 s cut off, the frameworks' default 10 s lease.
    nemesis("celery", "blackhole-all-lease10s")
