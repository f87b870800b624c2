"""Our own use of redis-py raises no warning in an asyncio process, on every topology.

redis-py 8 converts a sync ``Retry`` handed to an asyncio client into its
asyncio ``Retry``, with a ``UserWarning`` in every process (workers, clients,
the demo). A Taskiq worker's output is checked too (test_taskiq_worker.py).
"""

from __future__ import annotations

import warnings

from simplebroker_redis import AsyncMessages, AsyncRedisRunner
from simplebroker_redis.activity import AsyncActivity

TOPOLOGIES = ("single", "cluster", "sentinel")


async def test_asyncio_clients_warn_nothing(redis_url: str, namespace: str, topology: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = AsyncRedisRunner(redis_url, namespace=namespace)
        await runner.ensure_initialized()
        activity = AsyncActivity(runner, ["jobs"])  # a Pub/Sub (subscriber) connection
        await activity.start()
        await AsyncMessages(runner).write("jobs", "x")
        assert await activity.wait(10.0)
        await activity.close()
        await runner.aclose()
    # ResourceWarnings come from whatever the garbage collector frees meanwhile,
    # other tests' objects included: not what this test is about.
    ours = [
        w
        for w in caught
        if ("redis" in w.filename or "redis" in str(w.message))
        and not issubclass(w.category, ResourceWarning)
    ]
    assert ours == [], [f"{w.category.__name__}: {w.message}" for w in ours]
