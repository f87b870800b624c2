"""What the dashboard's task index and task statistics cost the server, per task.

Index: the same operations with the shipped scripts and with a build
whose ``lib/tasks.lua`` does nothing (a library of its own on the server),
alternating every 100 operations in one process, as ``ops_bench`` measures
the counters: a ``write`` that names a task key (the index's ``HSET``), the
same without one, and a reservation of one keyed message with its
acknowledgement deleting it (the index's ``HMGET`` and ``HDEL``s) — what a
Taskiq or Celery task costs. The figure is the script time the index adds
(``FCALL`` µs from ``INFO commandstats``, a median over blocks) as a share
of the server's whole CPU per operation (its threads' time from /proc) with
the emptied build.

Statistics: not a command per task but one ``task_stats.lua`` per process
every 5 s. A ``TaskStats`` counts tasks of five names as a worker would
(one enqueued and one finished run per task, execution times spread from
1 ms to 0.4 s) and sends them; the script's time divided by the tasks
counted is the cost per task, given for the tasks one process counts
between two sends (10, 100, 1,000: 2, 20, 200 tasks/s) and as a share of
the server's CPU for a task (a write, plus a reservation and its deleting
acknowledgement).

``python benchmarks/tasks_bench.py`` runs it alone; ``benchmarks/run.py``
runs it in the ``operations`` section.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from common import Server, median, render_table, task_cpu_seconds
from ops_bench import _two_libraries

BODY = "b" * 100
MODES = ("index", "no-index")
OPS = ("write (keyed)", "write (no key)", "reserve + ack (keyed)")
NO_INDEX = (
    "-- lib/tasks.lua, emptied for the benchmark\n"
    "-- uses: (nothing but the prelude)\n"
    "local function index_task(key, id, queue) end\n"
    "local function index_tasks(entries) end\n"
    "local function forget_tasks(ids) end\n"
)
#: Tasks one process counts between two sends, and task names among them.
STATS_LOADS = (10, 100, 1000)
STATS_NAMES = 5


def _script_usec(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("usec", 0))


#: The commands the index runs (the scripts run them for other keys too: the
#: difference between the builds is the index's own).
INDEX_COMMANDS = ("hset", "hget", "hmget", "hdel")


def _usec(client: redis.Redis) -> tuple[int, int]:
    """Return the microseconds of FCALL and of the index's commands, from INFO commandstats."""
    stats = client.info("commandstats")
    own = sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in INDEX_COMMANDS)
    return int(stats.get("cmdstat_fcall", {}).get("usec", 0)), own


def child(url: str, n: int, server_pid: int, block: int) -> dict[str, Any]:
    """Run the index operations in blocks of ``block``, alternating the two builds."""
    from simplebroker import resolve_config

    from simplebroker_redis import RedisRunner
    from simplebroker_redis import scripts as scripts_module
    from simplebroker_redis.core import RedisBrokerCore
    from simplebroker_redis.leases import Leases

    shipped, empty, empty_text = _two_libraries("tasks", NO_INDEX)
    current = {"prefix": shipped}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("simplebroker_redis") and module is not scripts_module:
            if getattr(module, "function_name", None) is scripts_module.function_name:
                module.function_name = lambda op: current["prefix"] + op  # type: ignore[attr-defined]
    namespace = f"bench-tasks-{uuid.uuid4().hex[:8]}"
    runner = RedisRunner(url, namespace=namespace)
    core = RedisBrokerCore(runner, config=resolve_config(override={"BROKER_AUTO_VACUUM": 0}))
    leases = Leases(runner)
    client = redis.Redis.from_url(url)
    totals = {
        mode: {op: {"n": 0, "cpu": 0.0, "script": [], "commands": 0} for op in OPS}
        for mode in MODES
    }
    counter = iter(range(10**9))
    try:
        core.write("warm", BODY)
        client.function_load(empty_text, replace=True)

        def cycle() -> None:
            lease = leases.reserve("c", 1, 30)
            leases.ack(lease.token, lease.ids, delete=True)

        bodies = {
            "write (keyed)": lambda: core.write("q", BODY, task_key=f"bench:{next(counter)}"),
            "write (no key)": lambda: core.write("q", BODY),
            "reserve + ack (keyed)": cycle,
        }
        for round_ in range(max(2, n // block)):
            for mode in MODES if round_ % 2 == 0 else tuple(reversed(MODES)):
                current["prefix"] = shipped if mode == "index" else empty
                for _ in range(block):  # what the cycle takes, written first (not measured)
                    core.write("c", BODY, task_key=f"bench:{next(counter)}")
                for op in OPS:
                    body = bodies[op]
                    script0, commands0 = _usec(client)
                    cpu0 = task_cpu_seconds(server_pid)
                    for _ in range(block):
                        body()
                    cpu1 = task_cpu_seconds(server_pid)
                    script1, commands1 = _usec(client)
                    row = totals[mode][op]
                    row["script"].append((script1 - script0) / block)
                    row["commands"] += commands1 - commands0
                    row["n"] += block
                    row["cpu"] += cpu1 - cpu0
        indexed = client.hlen(runner.keys.tasks)
        out: dict[str, Any] = {"indexed": indexed}
        for mode in MODES:
            out[mode] = {
                op: {
                    "server_cpu_us_per_op": row["cpu"] / row["n"] * 1e6,
                    "script_us_per_op": median(row["script"]),
                    "commands_us_per_op": row["commands"] / row["n"],
                }
                for op, row in totals[mode].items()
            }
    finally:
        for key in client.scan_iter(match=runner.keys.scan_pattern):
            client.delete(key)
        client.close()
        core.close()
        runner.shutdown()
    return out


def index_cost(server: Server, *, reps: int, quick: bool, progress: Any = None) -> dict[str, Any]:
    """Run the interleaved comparison ``reps`` times; return medians per op and mode."""
    n = 2000 if quick else 6000
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        m: {op: [] for op in OPS} for m in MODES
    }
    for rep in range(reps):
        done = subprocess.run(
            [sys.executable, __file__, "--child", server.url, str(n), str(server.pid), "100"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["indexed"] > 0, "the shipped build indexed nothing"
        for mode in MODES:
            for op in OPS:
                samples[mode][op].append(result[mode][op])
        if progress is not None:
            progress.step(f"task index: rep {rep + 1}")
    table: dict[str, Any] = {"n": n, "reps": reps, "ops": {}}
    for op in OPS:
        row: dict[str, Any] = {}
        for mode in MODES:
            row[mode] = {
                key: median([s[key] for s in samples[mode][op]])
                for key in ("server_cpu_us_per_op", "script_us_per_op", "commands_us_per_op")
            }
        on, off = row["index"], row["no-index"]
        added = on["script_us_per_op"] - off["script_us_per_op"]
        row["script_added_us"] = added
        row["script_cost_pct"] = 100 * added / off["server_cpu_us_per_op"]
        row["commands_added_us"] = on["commands_us_per_op"] - off["commands_us_per_op"]
        table["ops"][op] = row
    return table


def stats_cost(server: Server, *, reps: int) -> dict[str, Any]:
    """Time one send of the statistics of 10, 100 and 1,000 tasks; return µs per task."""
    from simplebroker_redis import RedisRunner
    from simplebroker_redis.tasks import TaskStats

    client = redis.Redis.from_url(server.url)
    runner = RedisRunner(server.url, namespace=f"bench-stats-{uuid.uuid4().hex[:8]}")
    out: dict[str, Any] = {}
    try:
        runner.ensure_initialized()
        for load in STATS_LOADS:
            per_task = []
            for rep in range(max(5, reps * 3)):
                stats = TaskStats(runner, interval=3600)
                for i in range(load):
                    name = f"app.task_{i % STATS_NAMES}"
                    stats.enqueued(name)
                    stats.finished(name, 0.001 * (1 + (i * 7 + rep) % 400), ok=i % 50 != 0)
                before = _script_usec(client)
                sent = stats.flush()
                # One record per name and minute (two when the counting crossed one).
                assert min(load, STATS_NAMES) <= sent <= 2 * min(load, STATS_NAMES)
                per_task.append((_script_usec(client) - before) / load)
                time.sleep(0.01)
            out[str(load)] = {"tasks": load, "script_us_per_task": median(per_task)}
    finally:
        for key in client.scan_iter(match=runner.keys.scan_pattern):
            client.delete(key)
        client.close()
        runner.shutdown()
    return out


def run_section(server: Server, *, reps: int, quick: bool, progress: Any) -> dict[str, Any]:
    """Run both parts."""
    index = index_cost(server, reps=reps, quick=quick, progress=progress)
    return {"index": index, "stats": stats_cost(server, reps=reps)}


def report(result: dict[str, Any]) -> str:
    """Return the tables."""
    index = result["index"]
    rows = [
        [
            op,
            f"{row['no-index']['server_cpu_us_per_op']:.1f}",
            f"{row['no-index']['script_us_per_op']:.1f}",
            f"{row['index']['script_us_per_op']:.1f}",
            f"{row['script_added_us']:+.2f}",
            f"{row['script_cost_pct']:+.1f} %",
            f"{row['commands_added_us']:+.2f}",
        ]
        for op, row in index["ops"].items()
    ]
    text = f"Task index (median of {index['reps']} reps x {index['n']} ops)\n\n"
    text += render_table(
        [
            "operation",
            "server CPU µs/op, no index",
            "script µs/op, no index",
            "with index",
            "added µs",
            "cost",
            "index commands µs",
        ],
        rows,
    )
    ops = index["ops"]
    task_cpu = (
        ops["write (keyed)"]["no-index"]["server_cpu_us_per_op"]
        + ops["reserve + ack (keyed)"]["no-index"]["server_cpu_us_per_op"]
    )
    stats_rows = [
        [
            str(row["tasks"]),
            f"{row['script_us_per_task']:.2f}",
            f"{100 * row['script_us_per_task'] / task_cpu:.2f} %",
        ]
        for row in result["stats"].values()
    ]
    text += (
        "\n\nTask statistics: one task_stats.lua per process and send; its script time per task"
        f"\n(share of a task's server CPU: write + reserve + ack = {task_cpu:.0f} µs)\n\n"
    )
    text += render_table(["tasks per send", "script µs per task", "cost"], stats_rows)
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        url, n, pid, block = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        print(json.dumps(child(url, n, pid, block)))
        return 0
    quick = "--quick" in argv
    with Server() as server:
        result = run_section(server, reps=3, quick=quick, progress=None)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
