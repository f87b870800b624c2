"""Topology section: the cluster client against a single server, and Taskiq shards.

- ``ops``: write and claim_one rates through a ``redis+cluster://`` runner
  (3 primaries) against a single server, same machine, interleaved reps.
- ``taskiq``: tasks end to end (kick, run, ack with result) on the 3-primary
  cluster with ``shards=1`` and ``shards=3``, and each primary's share of
  the server commands (``INFO commandstats`` deltas). The machine has 2 cores,
  so the rate cannot scale here; an even split is what shows it would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import redis
from common import Progress, median, rotated
from taskiq.receiver import Receiver

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevCluster, DevServer
from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker
from taskiq_simplebroker.shards import shard_namespaces

SINGLE, CLUSTER = "single server", "cluster (3 primaries)"
SHARDS = (1, 3)

#: Largest allowed distance of a primary's command share from an even split (K = 3).
EVEN_SPLIT_TOLERANCE = 0.15


def plan_units(reps: int) -> int:
    """Return the progress units of the section."""
    return reps * (2 + len(SHARDS))


def _commands(node_url: str) -> int:
    client = redis.Redis.from_url(node_url, decode_responses=True)
    try:
        stats = client.info("commandstats")
        return sum(int(entry["calls"]) for entry in stats.values())
    finally:
        client.close()


def _ops(url: str, count: int, namespace: str) -> dict[str, float]:
    runner = RedisRunner(url, namespace=namespace)
    core = RedisBrokerCore(runner)
    out: dict[str, float] = {}
    try:
        started = time.perf_counter()
        for n in range(count):
            core.write("bench", str(n))
        out["write_per_s"] = count / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(count):
            core.claim_one("bench")
        out["claim_per_s"] = count / (time.perf_counter() - started)
    finally:
        core.close()
        redis_backend_plugin.cleanup_target(url, backend_options={"namespace": namespace})
        runner.shutdown()
    return out


async def _taskiq(url: str, namespace: str, shards: int, tasks: int) -> float:
    worker = SimpleBrokerTaskiqBroker(url, namespace=namespace, shards=shards, prefetch=30)
    done = asyncio.Event()
    seen = [0]

    @worker.task(task_name="noop")
    async def noop(n: int) -> int:
        seen[0] += 1
        if seen[0] >= tasks:
            done.set()
        return n

    worker.with_result_backend(SimpleBrokerResultBackend(runner=worker.runner, shards=shards))
    producer = SimpleBrokerTaskiqBroker(url, namespace=namespace, shards=shards)
    await producer.startup()
    worker.is_worker_process = True
    finish = asyncio.Event()
    started = time.perf_counter()
    listening = asyncio.create_task(Receiver(worker, max_async_tasks=100).listen(finish))
    kicker = noop.kicker().with_broker(producer)
    for n in range(tasks):
        await kicker.kiq(n)
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - started
    finish.set()
    await asyncio.wait_for(listening, 30)
    await worker.shutdown()
    await producer.shutdown()
    for name in shard_namespaces(namespace, shards):
        redis_backend_plugin.cleanup_target(url, backend_options={"namespace": name})
    return tasks / elapsed


def run_section(
    *, reps: int, quick: bool, progress: Progress, emit: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Run the section on its own single server and 3-primary cluster; return its summary."""
    count = 300 if quick else 2000
    tasks = 200 if quick else 1500
    samples: dict[str, list[dict[str, float]]] = {SINGLE: [], CLUSTER: []}
    taskiq: dict[int, list[float]] = {k: [] for k in SHARDS}
    shares: dict[int, list[list[float]]] = {k: [] for k in SHARDS}
    with DevServer() as single, DevCluster(primaries=3) as cluster:
        urls = {SINGLE: single.url, CLUSTER: cluster.url}
        primaries = [f"redis://127.0.0.1:{node.port}/0" for node in cluster.primaries()]
        for rep in range(reps):
            for name in rotated([SINGLE, CLUSTER], rep):
                progress.step(f"topology ops {name}")
                result = _ops(urls[name], count, f"bench-topo-{rep}")
                samples[name].append(result)
                emit({"kind": "sample", "section": "topology", "target": name, **result})
            for shards in rotated(list(SHARDS), rep):
                progress.step(f"topology taskiq shards={shards}")
                before = [_commands(url) for url in primaries]
                rate = asyncio.run(_taskiq(cluster.url, f"bench-tq-{rep}", shards, tasks))
                spent = [_commands(url) - b for url, b in zip(primaries, before, strict=True)]
                total = sum(spent) or 1
                taskiq[shards].append(rate)
                shares[shards].append([n / total for n in spent])
                emit(
                    {
                        "kind": "sample",
                        "section": "topology",
                        "shards": shards,
                        "tasks_per_s": rate,
                        "node_shares": shares[shards][-1],
                    }
                )
    return {
        "ops": {
            name: {key: median(s[key] for s in rows) for key in ("write_per_s", "claim_per_s")}
            for name, rows in samples.items()
        },
        "taskiq": {
            str(k): {
                "tasks_per_s": median(taskiq[k]),
                "node_shares": [median(rep[i] for rep in shares[k]) for i in range(3)],
            }
            for k in SHARDS
        },
        "count": count,
        "tasks": tasks,
    }


def even_split_gap(summary: dict[str, Any], shards: int = 3) -> float | None:
    """Return the largest relative distance of a node's share from 1/3 (K = ``shards``)."""
    entry = summary.get("taskiq", {}).get(str(shards))
    if not entry:
        return None
    return max(abs(share * 3 - 1) for share in entry["node_shares"])


def report(summary: dict[str, Any]) -> str:
    """Return the section's tables."""
    lines = ["Topology: cluster client vs single server (median ops/s)", ""]
    lines.append("| target | write/s | claim_one/s |\n|---|---|---|")
    for name, row in summary["ops"].items():
        lines.append(f"| {name} | {row['write_per_s']:.0f} | {row['claim_per_s']:.0f} |")
    lines += ["", "Taskiq end to end on the cluster (median)", ""]
    lines.append("| shards | tasks/s | share of server commands per primary |\n|---|---|---|")
    for shards, row in summary["taskiq"].items():
        split = " / ".join(f"{share:.0%}" for share in row["node_shares"])
        lines.append(f"| {shards} | {row['tasks_per_s']:.0f} | {split} |")
    return "\n".join(lines)
