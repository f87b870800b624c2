"""Fixtures of the topology suite: a private Redis Cluster and a private Sentinel group.

Both are module-scoped (a start costs one to three seconds) and belong to the
module that uses them, so its tests may kill, fail over and reshard them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simplebroker_redis.devserver import DevCluster, DevSentinelGroup

#: Data-node password of the sentinel group (``requirepass`` / ``masterauth``).
DATA_PASSWORD = "data-pw"
#: Password of the sentinels themselves.
SENTINEL_PASSWORD = "sentinel-pw"


@pytest.fixture(scope="module")
def dev_cluster() -> Iterator[DevCluster]:
    """Three primaries with one replica each."""
    with DevCluster(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dev_sentinel() -> Iterator[DevSentinelGroup]:
    """One primary, one replica, three sentinels; data nodes and sentinels password-protected."""
    with DevSentinelGroup(
        replicas=1, password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD
    ) as group:
        yield group
