"""A Sentinel failover under a partition, shifted clocks, a producer cut off (short run).

The Sentinel primary partitioned from clients, replica and sentinels until
the sentinels promote the replica, then healed (every client with
``wait_replicas=1``); worker clocks an hour ahead and behind (leases are in
server time); the producer's path blackholed while it sends. See
docs/reliability.md.
"""

from __future__ import annotations

import pytest

# Once: the faults hit the workers and the network, whose server side the
# rest of the suite runs on Redis 7 too.
pytestmark = [pytest.mark.slow, pytest.mark.once]


def test_queue_through_a_failover_of_a_partitioned_primary(nemesis):
    nemesis("queue", "sentinel-failover-partitioned-primary-wait1")


def test_taskiq_with_worker_clocks_an_hour_off(nemesis):
    nemesis("taskiq", "clock-skew-1h")


def test_celery_producer_blackholed(nemesis):
    nemesis("celery", "producer-blackhole")
