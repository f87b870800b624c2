"""Operations benchmarks: what the script counters cost, and a scrape of 10,000 queues.

(The task index's and the task statistics' costs: ``tasks_bench``, run in
the same section.)

Counter cost: the same operations (``write``, ``reserve`` + ``ack``,
``claim``) run with the shipped scripts and with a build whose
``lib/counters.lua`` does nothing (a library of its own on the server: its
name carries a hash of its text), alternating every 100 operations in one
process, so the machine's changing load hits both builds alike. The figure
is the server's CPU per operation (its threads' scheduler time, read from
/proc between blocks), the cost the counters add where they run, with the
client's wall time beside it. On a shared machine that total moves by
5-10 % between runs, more than the counters cost, so the section also
reads the scripts' own execution time (``INFO commandstats``, the
``FCALL`` microseconds the server measures around each script, the
replies' I/O and the event loop left out) between blocks, a median over
the blocks so that one the OS preempted the server in does not count:
the difference between the two builds' script time is what the counters
add, and its share of the server's CPU per operation is the budget's
figure. ``HINCRBY``'s own time (the counters' one command) is reported
beside it.

Scrape: ``observe.read_namespace`` (``depths.lua``) of a namespace with
1,000 and 10,000 queues: round trips, wall time, and the script's server
time (``FCALL``).

``python benchmarks/ops_bench.py`` runs it alone; ``benchmarks/run.py``
runs it as the ``ops`` section.
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

BODY = "b" * 100
MODES = ("counters", "no-counters")
OPS = ("write", "reserve+ack", "claim")
NO_COUNTERS = (
    "-- lib/counters.lua, emptied for the benchmark\n"
    "-- uses: (nothing but the prelude)\n"
    "local function count_event(queue, event, n) end\n"
    "local function count_members(members, event) end\n"
)


def _two_libraries(module: str = "counters", text: str = NO_COUNTERS) -> tuple[str, str, str]:
    """Return (shipped prefix, emptied prefix, emptied library text).

    The emptied library is the shipped one with ``lua/lib/<module>.lua``
    replaced by ``text`` (the same functions, doing nothing).
    """
    from simplebroker_redis import scripts

    shipped = scripts._library()
    original = scripts.module_source

    def emptied(name: str) -> str:
        return text if name == module else original(name)

    scripts.module_source = emptied  # type: ignore[assignment]
    try:
        built = scripts._library.__wrapped__()  # uncached: the shipped one stays cached
    finally:
        scripts.module_source = original  # type: ignore[assignment]
    return shipped[1], built[1], built[2].text()


def child(url: str, n: int, server_pid: int, block: int) -> dict[str, Any]:
    """Run the operations in blocks of ``block``, alternating the two builds.

    Both libraries are loaded on the server; every module that calls
    ``function_name`` gets one that names the current build's function, so
    one process, one connection and one namespace run both, interleaved
    finely enough that the machine's changing load hits both alike.
    """
    from simplebroker import resolve_config

    from simplebroker_redis import RedisRunner
    from simplebroker_redis import scripts as scripts_module
    from simplebroker_redis.core import RedisBrokerCore
    from simplebroker_redis.leases import Leases

    shipped, empty, empty_text = _two_libraries()
    current = {"prefix": shipped}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("simplebroker_redis") and module is not scripts_module:
            if getattr(module, "function_name", None) is scripts_module.function_name:
                module.function_name = lambda op: current["prefix"] + op  # type: ignore[attr-defined]
    namespace = f"bench-ops-{uuid.uuid4().hex[:8]}"
    runner = RedisRunner(url, namespace=namespace)
    # No automatic vacuum: it would run inside whichever build's block it
    # fell in, and weigh on that one.
    core = RedisBrokerCore(runner, config=resolve_config(override={"BROKER_AUTO_VACUUM": 0}))
    leases = Leases(runner)
    client = redis.Redis.from_url(url)
    totals = {
        mode: {op: {"n": 0, "cpu": 0.0, "wall": 0.0, "script": [], "hincrby": 0} for op in OPS}
        for mode in MODES
    }

    def script_usec() -> tuple[int, int]:
        """Return the microseconds of FCALL and of HINCRBY (the counters' command)."""
        stats = client.info("commandstats")
        return tuple(  # type: ignore[return-value]
            int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in ("fcall", "hincrby")
        )

    try:
        core.write("warm", BODY)  # loads the shipped library, initializes the namespace
        client.function_load(empty_text, replace=True)

        def cycle() -> None:
            lease = leases.reserve("q", 1, 30)
            leases.ack(lease.token, lease.ids)

        bodies = {
            "write": lambda: core.write("q", BODY),
            "reserve+ack": cycle,
            "claim": lambda: core.claim_one("c"),
        }
        for round_ in range(max(2, n // block)):
            for mode in MODES if round_ % 2 == 0 else tuple(reversed(MODES)):
                current["prefix"] = shipped if mode == "counters" else empty
                for _ in range(block):  # what claim takes, written first (not measured)
                    core.write("c", BODY)
                for op in OPS:
                    body = bodies[op]
                    script0 = script_usec()  # outside the CPU reading: INFO costs too
                    cpu0 = task_cpu_seconds(server_pid)
                    started = time.perf_counter()
                    for _ in range(block):
                        body()
                    wall = time.perf_counter() - started
                    cpu1 = task_cpu_seconds(server_pid)
                    script1 = script_usec()
                    row = totals[mode][op]
                    row["script"].append((script1[0] - script0[0]) / block)
                    row["hincrby"] += script1[1] - script0[1]
                    row["n"] += block
                    row["cpu"] += cpu1 - cpu0
                    row["wall"] += wall
        counted = client.hgetall(runner.keys.counters)
        out: dict[str, Any] = {"counted": {k.decode(): int(v) for k, v in counted.items()}}
        for mode in MODES:
            out[mode] = {
                op: {
                    "server_cpu_us_per_op": row["cpu"] / row["n"] * 1e6,
                    "wall_us_per_op": row["wall"] / row["n"] * 1e6,
                    # Median over blocks: a block the OS preempted the
                    # server in does not move it.
                    "script_us_per_op": median(row["script"]),
                    "hincrby_us_per_op": row["hincrby"] / row["n"],
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


def counter_cost(server: Server, *, reps: int, quick: bool, progress: Any = None) -> dict[str, Any]:
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
        # Half the rounds ran the shipped build: it counted exactly their messages.
        assert result["counted"].get("q enqueued"), "the shipped build counted nothing"
        for mode in MODES:
            for op in OPS:
                samples[mode][op].append(result[mode][op])
        if progress is not None:
            progress.step(f"counters: rep {rep + 1}")
    table: dict[str, Any] = {"n": n, "reps": reps, "ops": {}}
    for op in OPS:
        row: dict[str, Any] = {}
        for mode in MODES:
            row[mode] = {
                key: median([s[key] for s in samples[mode][op]])
                for key in (
                    "wall_us_per_op",
                    "server_cpu_us_per_op",
                    "script_us_per_op",
                    "hincrby_us_per_op",
                )
            }
        on, off = row["counters"], row["no-counters"]
        # What the counters add to the scripts, as a share of all the server's
        # CPU for the operation (script, I/O, event loop): the budget's figure.
        added = on["script_us_per_op"] - off["script_us_per_op"]
        row["script_added_us"] = added
        row["script_cost_pct"] = 100 * added / off["server_cpu_us_per_op"]
        for name, key in (
            ("cpu_overhead_pct", "server_cpu_us_per_op"),
            ("wall_overhead_pct", "wall_us_per_op"),
        ):
            row[name] = 100 * (on[key] / off[key] - 1)
        table["ops"][op] = row
    return table


def scrape(server: Server, *, sizes: tuple[int, ...] = (1000, 10000)) -> dict[str, Any]:
    """Fill namespaces of ``sizes`` queues; time one reading of each."""
    from simplebroker_redis import AsyncMessages, AsyncRedisRunner, RedisRunner
    from simplebroker_redis.ops.observe import read_namespace

    client = redis.Redis.from_url(server.url)
    out: dict[str, Any] = {}
    try:
        for size in sizes:
            namespace = f"bench-scrape-{uuid.uuid4().hex[:8]}"
            _fill(server.url, namespace, size, AsyncRedisRunner, AsyncMessages)
            runner = RedisRunner(server.url, namespace=namespace)
            try:
                for page in (0, 1000):
                    walls, servers, trips = [], [], 0
                    for _ in range(5):
                        before = client.info("commandstats").get("cmdstat_fcall", {})
                        started = time.perf_counter()
                        state = read_namespace(runner, page_size=page)
                        walls.append(time.perf_counter() - started)
                        after = client.info("commandstats").get("cmdstat_fcall", {})
                        servers.append(int(after.get("usec", 0)) - int(before.get("usec", 0)))
                        trips = state.round_trips
                        assert len(state.queues) == size
                    out[f"{size}:{page}"] = {
                        "queues": size,
                        "page_size": page,
                        "round_trips": trips,
                        "wall_ms": median(walls) * 1000,
                        "server_ms": median(servers) / 1000,
                    }
            finally:
                for key in client.scan_iter(match=runner.keys.scan_pattern):
                    client.delete(key)
                runner.shutdown()
    finally:
        client.close()
    return out


def _fill(url: str, namespace: str, size: int, runner_class: Any, messages_class: Any) -> None:
    """Write 1-3 messages to each of ``size`` queues (group-committed asyncio writes)."""
    import asyncio

    async def fill() -> None:
        runner = runner_class(url, namespace=namespace)
        writer = messages_class(runner)
        try:
            for start in range(0, size, 500):
                await asyncio.gather(
                    *(
                        writer.write(f"queue-{i:05d}", BODY)
                        for i in range(start, min(size, start + 500))
                        for _ in range(i % 3 + 1)
                    )
                )
        finally:
            await runner.aclose()

    asyncio.run(fill())


def run_section(
    server: Server, *, reps: int, quick: bool, progress: Any, emit: Any
) -> dict[str, Any]:
    """Run both parts; emit their figures."""
    import tasks_bench  # noqa: PLC0415 - it imports this module

    result = {"counters": counter_cost(server, reps=reps, quick=quick, progress=progress)}
    result["tasks"] = tasks_bench.run_section(server, reps=reps, quick=quick, progress=progress)
    result["scrape"] = scrape(server, sizes=(1000,) if quick else (1000, 10000))
    emit({"kind": "ops", **result})
    return result


def plan_units(reps: int) -> int:
    """Return the progress units of the section (one per child run)."""
    return 2 * reps


def report(result: dict[str, Any]) -> str:
    """Return the section's tables."""
    counters = result["counters"]
    rows = []
    for op, row in counters["ops"].items():
        on, off = row["counters"], row["no-counters"]
        rows.append(
            [
                op,
                f"{off['server_cpu_us_per_op']:.1f}",
                f"{on['server_cpu_us_per_op']:.1f}",
                f"{row['cpu_overhead_pct']:+.1f} %",
                f"{off['wall_us_per_op']:.0f}",
                f"{on['wall_us_per_op']:.0f}",
                f"{row['wall_overhead_pct']:+.1f} %",
            ]
        )
    head = ["operation", "server CPU µs/op, no counters", "with counters", "cost"]
    head += ["wall µs/op, no counters", "with counters", "cost"]
    text = f"Script counters (median of {counters['reps']} reps x {counters['n']} ops)\n\n"
    text += render_table(head, rows)
    script_rows = [
        [
            op,
            f"{row['no-counters']['script_us_per_op']:.1f}",
            f"{row['counters']['script_us_per_op']:.1f}",
            f"{row['script_added_us']:+.2f}",
            f"{row['script_cost_pct']:+.1f} %",
            f"{row['counters']['hincrby_us_per_op']:.2f}",
        ]
        for op, row in counters["ops"].items()
        if "script_cost_pct" in row
    ]
    text += "\n\nScript time (FCALL µs/op from INFO commandstats) and the counters' share\n"
    text += "of the server's CPU per operation (no-counters column above); HINCRBY µs/op\n"
    text += "is the counter command's own time, without Lua's call into it\n\n"
    text += render_table(
        [
            "operation",
            "script µs/op, no counters",
            "with counters",
            "added µs",
            "cost",
            "HINCRBY µs/op",
        ],
        script_rows,
    )
    scrape_rows = [
        [
            str(s["queues"]),
            "all" if s["page_size"] == 0 else str(s["page_size"]),
            str(s["round_trips"]),
            f"{s['wall_ms']:.1f}",
            f"{s['server_ms']:.1f}",
        ]
        for s in result["scrape"].values()
    ]
    if "tasks" in result:
        import tasks_bench  # noqa: PLC0415 - it imports this module

        text += "\n\n" + tasks_bench.report(result["tasks"])
    text += "\n\nScrape: read_namespace (depths.lua), median of 5\n\n"
    text += render_table(
        ["queues", "page size", "round trips", "wall ms", "server ms"], scrape_rows
    )
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        url, n, pid, block = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        print(json.dumps(child(url, n, pid, block)))
        return 0
    quick = "--quick" in argv
    with Server() as server:
        result = run_section(server, reps=3, quick=quick, progress=None, emit=lambda _: None)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
