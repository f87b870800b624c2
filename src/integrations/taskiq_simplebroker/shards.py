"""One logical Taskiq queue over K namespaces (``shards=K``): K hash slots, K cluster nodes.

A namespace lives in one hash slot, so on a Redis Cluster all of a broker's
traffic goes to one primary. ``shards=K`` spreads one logical queue over K
namespaces whose hash slots lie in K equal parts of the slot space, so a
cluster whose primaries split the slots evenly (as ``valkey-cli --cluster
create`` does) serves each shard from a different node when K equals the
number of primaries.

- A task goes to shard :func:`shard_index` of its task ID, and its result is
  stored in the same shard (written with the task's acknowledgement), so a
  result is found from the task ID alone.
- A worker runs one listener per shard (each with its own leases, heartbeat
  and recovery) and takes their tasks in turn (:func:`merged`).
- K = 1 is the namespace itself: exactly what an unsharded broker uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final, TypeVar

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from simplebroker_redis import AsyncRedisRunner
from simplebroker_redis.keys import validate_namespace

from .errors import ConfigurationError

T = TypeVar("T")

#: Most shards one broker may use.
MAX_SHARDS: Final[int] = 64


def check_shards(shards: object) -> int:
    """Return ``shards`` if it is a valid shard count, else raise ``ConfigurationError``."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ConfigurationError(f"shards must be an integer from 1 to {MAX_SHARDS}")
    return shards


def shard_namespaces(namespace: str, shards: int) -> list[str]:
    """Return the K namespaces of ``namespace`` (itself when K = 1).

    Shard ``i`` is the first ``<namespace>.s<i>-<j>`` (j = 0, 1, ...) whose
    hash slot lies in the i-th K-th of the slot space: deterministic, so
    every process computes the same names.
    """
    if shards == 1:
        return [namespace]
    names = []
    for i in range(shards):
        j = 0
        while True:
            name = f"{namespace}.s{i}-{j}"
            slot = key_slot(f"{{{name}}}".encode())
            if slot * shards // REDIS_CLUSTER_HASH_SLOTS == i:
                names.append(validate_namespace(name))
                break
            j += 1
    return names


def shard_index(task_id: str, shards: int) -> int:
    """Return the shard of a task (CRC-32 of its ID: the same in every process)."""
    return 0 if shards == 1 else zlib.crc32(task_id.encode("utf-8")) % shards


def shard_runners(runner: AsyncRedisRunner, shards: int) -> list[AsyncRedisRunner]:
    """Return one runner per shard: ``[runner]`` for K = 1, else new ones on its target."""
    if shards == 1:
        return [runner]
    return [
        AsyncRedisRunner(
            runner.target,
            dataclasses.replace(runner.options, namespace=name),
            config=runner.config,
        )
        for name in shard_namespaces(runner.options.namespace, shards)
    ]


async def merged(generators: list[AsyncGenerator[T, None]]) -> AsyncIterator[T]:
    """Yield the items of every generator in turn, asking each for its next only when taken.

    Each generator has one item at most waiting here, so a shard's listener
    reserves again only once its last task was handed to Taskiq; items are
    taken in the order they arrived, so busy shards alternate. An error of
    one generator ends the merge. Closing this closes every generator.
    """
    ready: asyncio.Queue[tuple[T | None, BaseException | None, asyncio.Event]] = asyncio.Queue()

    async def pump(generator: AsyncGenerator[T, None]) -> None:
        taken = asyncio.Event()
        try:
            async for item in generator:
                taken.clear()
                await ready.put((item, None, taken))
                await taken.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await ready.put((None, exc, taken))

    tasks = [asyncio.ensure_future(pump(generator)) for generator in generators]
    try:
        while True:
            item, error, taken = await ready.get()
            if error is not None:
                raise error
            taken.set()
            yield item  # type: ignore[misc] # None only with an error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for generator in generators:
            await generator.aclose()
