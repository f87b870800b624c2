"""Backend benchmarks through SimpleBroker's public API.

Three entries are compared side by side:

- ``redis``: our backend (``simplebroker-redis``) through ``simplebroker.Queue``
  on a project target (``.broker.toml`` with ``backend = "redis"``);
- ``sqlite``: SimpleBroker's built-in SQLite backend, same calls;
- ``raw``: redis-py calling one minimal Lua script per operation
  (:mod:`raw`), the practical one-round-trip limit on this machine.

Each sample runs on a fresh namespace / database file / raw keyspace that is
filled (untimed) before the timed loop and dropped after it.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from common import (
    ClientCounter,
    Progress,
    Server,
    fmt_num,
    fmt_ratio,
    in_order,
    median,
    percentile,
    render_table,
    rotated,
)
from raw import RawStore

BODY = "b" * 100  #: the 100-byte message body of every write
REDIS, SQLITE, RAW = "redis", "sqlite", "raw"
ENTRIES = (REDIS, SQLITE, RAW)


# -- operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One measured operation (a row of the throughput table)."""

    key: str
    label: str
    n: int  #: calls per sample (full run)
    msgs: int = 1  #: messages each call handles
    raw: str | None = ""  #: raw op giving the limit ("" = same key, None = no raw)
    count_n: int = 200  #: calls in the round-trip counting pass

    @property
    def raw_key(self) -> str | None:
        """Return the key of the raw operation this op is compared with."""
        return self.key if self.raw == "" else self.raw


OPS: tuple[Op, ...] = (
    Op("noop", "raw floor: one empty EVALSHA", 2000, raw=""),
    Op("write", "write (100 B body)", 1500),
    Op("claim_one", "claim_one (read_one)", 1500),
    Op("read_many", "read_many(100) [claim_many]", 80, msgs=100, count_n=20),
    Op("alo_batches", "at-least-once generator, batches of 100", 50, msgs=100, count_n=10),
    Op("peek_many", "peek_many(100)", 300, msgs=100, count_n=50),
    Op("move_many", "move_many(100)", 80, msgs=100, count_n=20),
    Op("broadcast", "broadcast to 100 queues", 80, msgs=100, count_n=20),
    Op("write_100q", "write, 100 queues present", 1500),
    Op("claim_100q", "claim_one, 100 queues present", 1500),
    Op("default_write", "default Queue: write", 120, raw="write", count_n=50),
    Op("default_claim", "default Queue: claim_one", 120, raw="claim_one", count_n=50),
)

RAW_ONLY = {"noop"}


@dataclass
class Prepared:
    """A filled, warmed-up sample: ``run()`` is the timed part."""

    run: Callable[[], int]  #: returns how many messages it handled
    expected: int
    cleanup: Callable[[], None]


# -- entries ------------------------------------------------------------------------------


class SBEntry:
    """SimpleBroker's public API on our redis backend or on SQLite."""

    def __init__(self, kind: str, server_url: str, workdir: Path) -> None:
        self.name = kind
        self.kind = kind
        self.url = server_url
        self.workdir = workdir
        self.redis_backed = kind == REDIS

    # -- targets --------------------------------------------------------------------
    def new_target(self, tag: str) -> tuple[Any, str]:
        """Return (target, handle) of a fresh namespace or database file."""
        unique = f"{tag}-{uuid.uuid4().hex[:8]}"
        if self.kind == SQLITE:
            path = self.workdir / f"{unique}.db"
            return str(path), str(path)
        from simplebroker import target_for_directory

        directory = self.workdir / unique
        directory.mkdir(parents=True)
        write_project_toml(directory, self.url, f"bench-{unique}")
        return target_for_directory(directory), f"bench-{unique}"

    def drop_target(self, handle: str) -> None:
        """Delete a namespace or database file."""
        if self.kind == SQLITE:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(handle + suffix)
            return
        from simplebroker_redis import redis_backend_plugin

        redis_backend_plugin.cleanup_target(self.url, backend_options={"namespace": handle})

    # -- samples -----------------------------------------------------------------------
    def prepare(self, op: Op, n: int) -> Prepared:
        """Fill and warm up a fresh target for ``n`` calls of ``op``."""
        from simplebroker import Queue, open_broker

        target, handle = self.new_target(op.key)
        stack = contextlib.ExitStack()

        def queue(name: str, persistent: bool = True) -> Any:
            q = Queue(name, db_path=target, persistent=persistent)
            stack.callback(q.close)
            q.peek_one()  # open the connection / pool before timing
            return q

        others = {f"other{i:03d}": 10 for i in range(100)}
        key = op.key
        if key in ("write", "write_100q", "default_write"):
            if key == "write_100q":
                fill(target, others)
            q = queue("bench", persistent=key != "default_write")

            def run() -> int:
                for _ in range(n):
                    q.write(BODY)
                return n

            expected = n
        elif key in ("claim_one", "claim_100q", "default_claim"):
            fill(target, {"bench": n, **(others if key == "claim_100q" else {})})
            q = queue("bench", persistent=key != "default_claim")

            def run() -> int:
                return sum(q.read_one() is not None for _ in range(n))

            expected = n
        elif key == "read_many":
            fill(target, {"bench": n * 100})
            q = queue("bench")

            def run() -> int:
                return sum(len(q.read_many(100)) for _ in range(n))

            expected = n * 100
        elif key == "alo_batches":
            fill(target, {"bench": n * 100})
            q = queue("bench")

            def run() -> int:
                return sum(1 for _ in q.read_generator(delivery_guarantee="at_least_once"))

            expected = n * 100
        elif key == "peek_many":
            fill(target, {"bench": 100})
            q = queue("bench")

            def run() -> int:
                return sum(len(q.peek_many(100)) for _ in range(n))

            expected = n * 100
        elif key == "move_many":
            fill(target, {"bench": n * 100})
            q = queue("bench")

            def run() -> int:
                return sum(len(q.move_many("moved", 100)) for _ in range(n))

            expected = n * 100
        elif key == "broadcast":
            fill(target, {f"queue{i:03d}": 1 for i in range(100)})
            conn = stack.enter_context(open_broker(target))
            conn.get_queue_stats()

            def run() -> int:
                return sum(conn.broadcast(BODY) for _ in range(n))

            expected = n * 100
        else:
            raise KeyError(key)

        def cleanup() -> None:
            stack.close()
            self.drop_target(handle)

        return Prepared(run, expected, cleanup)


class RawEntry:
    """The raw limit (see :mod:`raw`)."""

    name = RAW
    redis_backed = True

    def __init__(self, server_url: str) -> None:
        self.url = server_url
        self.base = RawStore.open(server_url)
        self.base.noop()

    def prepare(self, op: Op, n: int) -> Prepared:
        """Fill a fresh raw keyspace for ``n`` calls of ``op``."""
        store = self.base.sibling()
        key = op.key
        others = {f"other{i:03d}": 10 for i in range(100)}
        if key == "noop":

            def run() -> int:
                for _ in range(n):
                    store.noop()
                return n

            expected = n
        elif key in ("write", "write_100q"):
            if key == "write_100q":
                store.fill(others, BODY)

            def run() -> int:
                for _ in range(n):
                    store.write("bench", BODY)
                return n

            expected = n
        elif key in ("claim_one", "claim_100q"):
            store.fill({"bench": n, **(others if key == "claim_100q" else {})}, BODY)

            def run() -> int:
                return sum(len(store.claim("bench", 1)) // 2 for _ in range(n))

            expected = n
        elif key == "read_many":
            store.fill({"bench": n * 100}, BODY)

            def run() -> int:
                return sum(len(store.claim("bench", 100)) // 2 for _ in range(n))

            expected = n * 100
        elif key == "alo_batches":
            store.fill({"bench": n * 100}, BODY)

            def run() -> int:
                got = 0
                while True:
                    token = uuid.uuid4().hex
                    batch = store.reserve("bench", token, 100)
                    if not batch:
                        return got
                    for i in range(0, len(batch), 2):
                        got += batch[i + 1] is not None
                    store.commit(token)

            expected = n * 100
        elif key == "peek_many":
            store.fill({"bench": 100}, BODY)

            def run() -> int:
                return sum(len(store.peek("bench", 100)) // 2 for _ in range(n))

            expected = n * 100
        elif key == "move_many":
            store.fill({"bench": n * 100}, BODY)

            def run() -> int:
                return sum(len(store.move("bench", "moved", 100)) // 2 for _ in range(n))

            expected = n * 100
        elif key == "broadcast":
            store.fill({f"queue{i:03d}": 1 for i in range(100)}, BODY)

            def run() -> int:
                return sum(store.broadcast(BODY) for _ in range(n))

            expected = n * 100
        else:
            raise KeyError(key)
        return Prepared(run, expected, store.drop)

    def close(self) -> None:
        """Close the client."""
        self.base.close()


def write_project_toml(directory: Path, url: str, namespace: str) -> None:
    """Write a ``.broker.toml`` selecting our backend and ``namespace``."""
    (directory / ".broker.toml").write_text(
        "version = 1\n"
        'backend = "redis"\n'
        f'target = "{url}"\n'
        "\n[backend_options]\n"
        f'namespace = "{namespace}"\n',
        encoding="utf-8",
    )


def fill(target: Any, counts: dict[str, int]) -> None:
    """Add pending messages with exact IDs through ``open_broker().insert_messages``."""
    from simplebroker import open_broker

    with open_broker(target) as conn:
        next_id = conn.generate_timestamp() + 1
        records: list[tuple[str, str, int]] = []
        for queue, count in counts.items():
            for _ in range(count):
                records.append((queue, BODY, next_id))
                next_id += 1
                if len(records) >= 5000:
                    conn.insert_messages(records)
                    records = []
        if records:
            conn.insert_messages(records)


# -- the throughput section -------------------------------------------------------------


@dataclass
class Context:
    """What every part of the section shares."""

    server: Server
    reps: int
    quick: bool
    progress: Progress
    emit: Callable[[dict[str, Any]], None]
    workdir: Path
    entries: dict[str, Any] = field(default_factory=dict)

    def scale(self, n: int, minimum: int = 10) -> int:
        """Return ``n`` for a full run, about a tenth of it for --quick."""
        return max(minimum, n // 10) if self.quick else n


def measure_sample(ctx: Context, entry: Any, op: Op, n: int, rep: int) -> dict[str, Any]:
    """Run one timed sample of ``op`` on ``entry``."""
    prepared = entry.prepare(op, n)
    try:
        server_cpu0 = ctx.server.cpu_seconds() if entry.redis_backed else 0.0
        measuring = ctx.server.stats().measure() if entry.redis_backed else _null()
        with measuring as delta:
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            handled = prepared.run()
            secs = time.perf_counter() - t0
            client_cpu = time.process_time() - cpu0
        server_cpu = ctx.server.cpu_seconds() - server_cpu0 if entry.redis_backed else None
    finally:
        prepared.cleanup()
    sample = {
        "section": "backend",
        "op": op.key,
        "entry": entry.name,
        "rep": rep,
        "calls": n,
        "seconds": secs,
        "ops_per_s": n / secs,
        "msgs_per_s": n * op.msgs / secs,
        "handled": handled,
        "expected": prepared.expected,
        "valid": handled == prepared.expected,
        "client_cpu_us_per_op": client_cpu / n * 1e6,
    }
    if entry.redis_backed and delta is not None:
        sample.update(
            server_cmds_per_op=delta.total / n,
            scripts_per_op=delta.scripts / n,
            script_us_per_op=delta.script_usec / n,
            server_cpu_us_per_op=(server_cpu or 0.0) / n * 1e6,
        )
    return sample


@contextlib.contextmanager
def _null() -> Any:
    yield None


def count_round_trips(ctx: Context, entry: Any, op: Op) -> dict[str, Any]:
    """Untimed pass counting client round trips/commands and server commands."""
    n = ctx.scale(op.count_n, minimum=5)
    prepared = entry.prepare(op, n)
    try:
        # The measuring client's INFO calls stay outside the counter.
        with ctx.server.stats().measure() as delta, ClientCounter() as counter:
            prepared.run()
    finally:
        prepared.cleanup()
    return {
        "section": "backend",
        "kind": "count",
        "op": op.key,
        "entry": entry.name,
        "calls": n,
        "rt_per_op": counter.round_trips / n,
        "client_cmds_per_op": counter.commands / n,
        "server_cmds_per_op": delta.total / n,
        "lua_inner_cmds_per_op": max(0, delta.total - counter.commands) / n,
        "scripts_per_op": delta.scripts / n,
        "commands": dict(sorted(delta.calls.items())),
    }


def run_throughput(ctx: Context, ops: Iterable[Op]) -> dict[str, Any]:
    """Measure every op on every entry; return medians and counts per op."""
    results: dict[str, Any] = {}
    for op in ops:
        names = [RAW] if op.key in RAW_ONLY else [REDIS, SQLITE] + ([RAW] if op.raw == "" else [])
        entries = [ctx.entries[name] for name in names]
        n = ctx.scale(op.n)
        samples: dict[str, list[dict[str, Any]]] = {e.name: [] for e in entries}
        for rep in range(ctx.reps):
            for entry in rotated(entries, rep):
                ctx.progress.note(f"{op.key} / {entry.name} rep {rep + 1}")
                sample = measure_sample(ctx, entry, op, n, rep)
                samples[entry.name].append(sample)
                ctx.emit(sample)
                ctx.progress.step(f"{op.key} / {entry.name} rep {rep + 1}")
        counts = {}
        for entry in entries:
            if entry.redis_backed:
                ctx.progress.note(f"{op.key} / {entry.name} counting round trips")
                counts[entry.name] = count_round_trips(ctx, entry, op)
                ctx.emit(counts[entry.name])
        results[op.key] = {
            "op": op.key,
            "label": op.label,
            "msgs": op.msgs,
            "raw_key": op.raw_key,
            "median": {
                name: {
                    key: median(s.get(key) for s in got)
                    for key in (
                        "ops_per_s",
                        "msgs_per_s",
                        "server_cmds_per_op",
                        "scripts_per_op",
                        "script_us_per_op",
                        "server_cpu_us_per_op",
                        "client_cpu_us_per_op",
                    )
                }
                for name, got in samples.items()
            },
            "valid": {name: all(s["valid"] for s in got) for name, got in samples.items()},
            "counts": counts,
        }
    return results


# -- watcher latency ------------------------------------------------------------------------


def watcher_latencies(ctx: Context, entry_name: str, n: int, gap: float) -> list[float]:
    """Write ``n`` messages one at a time; return write-to-handler latencies in ms."""
    got = threading.Event()
    stamp = [0]

    def handler(message: str, timestamp: int) -> None:
        stamp[0] = time.perf_counter_ns()
        got.set()

    latencies: list[float] = []
    if entry_name == RAW:
        store = ctx.entries[RAW].base.sibling()
        stop = threading.Event()
        ready = threading.Event()

        def listen() -> None:
            pubsub = store.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(store.prefix + "wake:watch")
            ready.set()
            while not stop.is_set():
                if pubsub.get_message(timeout=0.05) is None:
                    continue
                while True:
                    pair = store.claim("watch", 1)
                    if not pair:
                        break
                    handler(pair[1], int(pair[0]))
            pubsub.close()

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        ready.wait(5)

        def write() -> None:
            store.write("watch", BODY)

        def finish() -> None:
            stop.set()
            thread.join(5)
            store.drop()

    else:
        from simplebroker import Queue, QueueWatcher

        entry = ctx.entries[entry_name]
        target, handle = entry.new_target("watch")
        q = Queue("watch", db_path=target, persistent=True)
        q.peek_one()
        watcher = QueueWatcher("watch", handler, db=target)
        watcher.run_in_thread()

        def write() -> None:
            q.write(BODY)

        def finish() -> None:
            watcher.stop()
            q.close()
            entry.drop_target(handle)

    try:
        for i in range(n + 5):  # the first 5 warm up
            time.sleep(gap)
            got.clear()
            t0 = time.perf_counter_ns()
            write()
            if not got.wait(5.0):
                raise RuntimeError(f"{entry_name}: watcher handler not called within 5 s")
            if i >= 5:
                latencies.append((stamp[0] - t0) / 1e6)
    finally:
        finish()
    return latencies


def run_watcher(ctx: Context) -> dict[str, Any]:
    """Write-to-handler latency p50/p99 of a QueueWatcher (and the raw Pub/Sub limit)."""
    n = ctx.scale(200, minimum=40)
    gap = 0.002
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in ENTRIES}
    for rep in range(ctx.reps):
        for name in rotated(list(ENTRIES), rep):
            ctx.progress.note(f"watcher / {name} rep {rep + 1}")
            lat = watcher_latencies(ctx, name, n, gap)
            sample = {
                "section": "backend",
                "op": "watcher",
                "entry": name,
                "rep": rep,
                "samples": len(lat),
                "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99),
                "max_ms": max(lat),
            }
            samples[name].append(sample)
            ctx.emit(sample)
            ctx.progress.step(f"watcher / {name} rep {rep + 1}")
    out: dict[str, Any] = {
        name: {k: median(s[k] for s in got) for k in ("p50_ms", "p99_ms", "max_ms")}
        for name, got in samples.items()
    }
    ctx.progress.note("watcher / idle")
    out["idle_cmds_per_s"] = idle_watcher_commands(seconds=3.0 if ctx.quick else 5.0)
    ctx.emit(
        {
            "section": "backend",
            "op": "idle_watcher",
            "entry": REDIS,
            "cmds_per_s": out["idle_cmds_per_s"],
        }
    )
    return out


def idle_watcher_commands(seconds: float) -> float:
    """Server commands per second of one idle QueueWatcher, measured as an operator would.

    ``INFO stats`` ``total_commands_processed`` over ``seconds`` on a private
    server with nothing else connected (commands run inside a script count).
    """
    from simplebroker import BrokerTarget, Queue, QueueWatcher

    from simplebroker_redis import redis_backend_plugin
    from simplebroker_redis.devserver import DevServer

    with DevServer() as server:
        options = {"namespace": "idle"}
        redis_backend_plugin.initialize_target(server.url, backend_options=options)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        queue = Queue("idle", db_path=BrokerTarget("redis", server.url, options))
        watcher = QueueWatcher(queue, lambda body, _id: None)
        thread = watcher.run_in_thread()
        try:
            time.sleep(1.5)  # the first drain, the subscription, the first empty check
            before = int(client.info("stats")["total_commands_processed"])
            time.sleep(seconds)
            after = int(client.info("stats")["total_commands_processed"])
        finally:
            watcher.stop()
            thread.join(5)
            queue.close()
            client.close()
    return (after - before - 1) / seconds  # minus the second INFO itself


# -- reservations (simplebroker_redis.Leases) --------------------------------------------------

LEASE_OPS = (
    ("reserve", "reserve a batch of 100", 80),
    ("commit", "commit a batch of 100", 80),
    ("ack_one", "ack one message", 800),
    ("renew", "renew 100 leases of one worker", 250),
    ("recover", "recovery scan, nothing stale (100 live leases)", 800),
)


def _lease_prepared(ctx: Context, key: str, n: int) -> Prepared:
    from simplebroker_redis import Leases, RedisRunner

    entry = ctx.entries[REDIS]
    target, handle = entry.new_target("lease")
    runner = RedisRunner(ctx.server.url, namespace=handle)
    leases = Leases(runner)
    lease_s = 600.0
    if key == "reserve":
        fill(target, {"lq": n * 100})

        def run() -> int:
            return sum(len(leases.reserve("lq", 100, lease_s).messages) for _ in range(n))

        expected = n * 100
    elif key == "commit":
        fill(target, {"lq": n * 100})
        tokens = [leases.reserve("lq", 100, lease_s).token for _ in range(n)]

        def run() -> int:
            return sum(leases.commit(token).settled for token in tokens)

        expected = n * 100
    elif key == "ack_one":
        fill(target, {"lq": n})
        lease = leases.reserve("lq", n, lease_s)

        def run() -> int:
            return sum(leases.ack(lease.token, [i]).settled for i in lease.ids)

        expected = n
    elif key in ("renew", "recover"):
        fill(target, {"lq": 100})
        tokens = [leases.reserve("lq", 1, lease_s).token for _ in range(100)]
        if key == "renew":

            def run() -> int:
                return sum(100 - len(leases.renew(tokens, lease_s)) for _ in range(n))

            expected = n * 100
        else:

            def run() -> int:
                return sum(leases.recover().tokens == 0 for _ in range(n))

            expected = n
    else:
        raise KeyError(key)

    def cleanup() -> None:
        runner.shutdown()
        entry.drop_target(handle)

    return Prepared(run, expected, cleanup)


class _LeaseEntry:
    name = REDIS
    redis_backed = True

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def prepare(self, op: Op, n: int) -> Prepared:
        return _lease_prepared(self.ctx, op.key, n)


def run_leases(ctx: Context) -> dict[str, Any]:
    """Rates, round trips and server commands of the reservation API."""
    entry = _LeaseEntry(ctx)
    results: dict[str, Any] = {}
    ops = [Op(key, label, n, count_n=max(10, n // 20)) for key, label, n in LEASE_OPS]
    for rep in range(ctx.reps):
        for op in rotated(ops, rep):
            ctx.progress.note(f"leases / {op.key} rep {rep + 1}")
            sample = measure_sample(ctx, entry, op, ctx.scale(op.n), rep)
            sample["section"] = "leases"
            ctx.emit(sample)
            results.setdefault(op.key, {"label": op.label, "samples": []})["samples"].append(sample)
            ctx.progress.step(f"leases / {op.key} rep {rep + 1}")
    for op in ops:
        got = results[op.key].pop("samples")
        results[op.key]["median"] = {
            k: median(s[k] for s in got)
            for k in ("ops_per_s", "server_cmds_per_op", "script_us_per_op", "client_cpu_us_per_op")
        }
        results[op.key]["valid"] = all(s["valid"] for s in got)
        counted = count_round_trips(ctx, entry, op)
        counted["section"] = "leases"
        ctx.emit(counted)
        results[op.key]["counts"] = counted
    return results


# -- keep_newest displacing many rows -----------------------------------------------------------


def run_keep_newest(ctx: Context) -> dict[str, Any]:
    """Wall and server time of ``write(body, keep_newest=1)`` over a big queue."""
    from simplebroker import Queue

    rows = 10_000 if ctx.quick else 100_000
    samples: dict[str, list[dict[str, Any]]] = {REDIS: [], SQLITE: []}
    for rep in range(ctx.reps):
        for name in rotated([REDIS, SQLITE], rep):
            ctx.progress.note(f"keep_newest / {name} rep {rep + 1} (filling {rows:,} rows)")
            entry = ctx.entries[name]
            target, handle = entry.new_target("keep")
            try:
                fill(target, {"keep": rows})
                q = Queue("keep", db_path=target, persistent=True)
                q.peek_one()
                stats = ctx.server.stats()
                with stats.measure() if name == REDIS else _null() as delta:
                    t0 = time.perf_counter()
                    q.write(BODY, keep_newest=1)
                    secs = time.perf_counter() - t0
                left = len(q.peek_many(10))
                q.close()
            finally:
                entry.drop_target(handle)
            sample = {
                "section": "backend",
                "op": "keep_newest",
                "entry": name,
                "rep": rep,
                "rows": rows,
                "wall_ms": secs * 1000,
                "server_ms": (delta.script_usec / 1000) if delta is not None else None,
                "valid": left == 1,
            }
            samples[name].append(sample)
            ctx.emit(sample)
            ctx.progress.step(f"keep_newest / {name} rep {rep + 1}")
    return {
        "rows": rows,
        **{
            name: {
                "wall_ms": median(s["wall_ms"] for s in got),
                "server_ms": median(s["server_ms"] for s in got),
                "valid": all(s["valid"] for s in got),
            }
            for name, got in samples.items()
        },
    }


# -- 4 writers + 2 claimers in separate processes -----------------------------------------------


def _mp_body(writer: int, seq: int) -> str:
    return f"{writer}:{seq}:".ljust(100, "m")


def _mp_open(
    kind: str, spec: str
) -> tuple[Callable[[str], int], Callable[[], Any], Callable[[], list[tuple[str, int]]]]:
    """Return (write(body) -> id, claim() -> (body, id) | None, drain() -> up to 1000)."""
    if kind == RAW:
        url, prefix = spec.split("|", 1)
        store = RawStore.open(url, prefix)

        def raw_claim() -> tuple[str, int] | None:
            got = store.claim("mp", 1)
            return (got[1], int(got[0])) if got else None

        def raw_drain() -> list[tuple[str, int]]:
            got = store.claim("mp", 1000)
            return [(got[i + 1], int(got[i])) for i in range(0, len(got), 2)]

        return (lambda body: store.write("mp", body)), raw_claim, raw_drain
    from simplebroker import Queue, target_for_directory

    target: Any = spec if kind == SQLITE else target_for_directory(spec)
    q = Queue("mp", db_path=target, persistent=True)
    q.peek_one()
    return (
        q.write,
        (lambda: q.read_one(with_timestamps=True)),
        (lambda: q.read_many(1000, with_timestamps=True)),
    )


def mp_child(
    role: str,
    index: int,
    kind: str,
    spec: str,
    duration: float,
    reps: int,
    start: Any,
    done: Any,
    out_dir: str,
) -> None:
    """One writer or claimer process serving every repetition.

    Module-level so ``spawn`` can import it. Each repetition starts when the
    parent joins the ``start`` barrier and ends with the ``done`` barrier,
    after this process wrote its record for the repetition.
    """
    write, claim, drain = _mp_open(kind, spec)
    seq = 0
    for rep in range(reps):
        start.wait()
        stop = time.monotonic() + duration
        record: dict[str, Any] = {"role": role, "index": index, "first_seq": seq}
        if role == "writer":
            ids = []
            while time.monotonic() < stop:
                ids.append(write(_mp_body(index, seq)))
                seq += 1
            record["ids"] = ids
        else:
            window: list[tuple[str, int]] = []
            while time.monotonic() < stop:
                got = claim()
                if got is None:
                    time.sleep(0.0005)
                else:
                    window.append(got)
            # Drain (untimed, in batches) what the writers committed, until the
            # queue stays empty, so lost and duplicated IDs can be counted.
            late: list[tuple[str, int]] = []
            empty_since = None
            while True:
                batch = drain()
                if batch:
                    late.extend(batch)
                    empty_since = None
                    continue
                now = time.monotonic()
                empty_since = empty_since or now
                if now - empty_since > 0.2 and now > stop + 0.3:
                    break
                time.sleep(0.005)
            record["window"] = window
            record["late"] = late
        Path(out_dir, f"{rep}-{role}{index}.json").write_text(json.dumps(record), encoding="utf-8")
        done.wait()


@dataclass
class MPGroup:
    """The 6 processes of one backend, spawned once for all repetitions."""

    name: str
    procs: list[Any]
    start: Any
    done: Any
    out_dir: Path
    cleanup: Callable[[], None]


def mp_spawn(ctx: Context, name: str, duration: float) -> MPGroup:
    """Spawn 4 writers and 2 claimers of ``name`` on a fresh target."""
    spawn = mp.get_context("spawn")
    out_dir = Path(tempfile.mkdtemp(prefix=f"mp-{name}-", dir=ctx.workdir))
    if name == RAW:
        store = ctx.entries[RAW].base.sibling()
        spec = f"{ctx.server.url}|{store.prefix}"
        cleanup: Callable[[], None] = store.drop
    else:
        entry = ctx.entries[name]
        _, handle = entry.new_target("mp")
        spec = handle if name == SQLITE else str(ctx.workdir / handle.removeprefix("bench-"))

        def cleanup(entry: Any = entry, handle: str = handle) -> None:
            entry.drop_target(handle)

    roles = [("writer", i) for i in range(4)] + [("claimer", i) for i in range(2)]
    start = spawn.Barrier(len(roles) + 1)
    done = spawn.Barrier(len(roles) + 1)
    procs = []
    for role, index in roles:
        proc = spawn.Process(
            target=mp_child,
            args=(role, index, name, spec, duration, ctx.reps, start, done, str(out_dir)),
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    return MPGroup(name, procs, start, done, out_dir, cleanup)


def mp_sample(ctx: Context, group: MPGroup, duration: float, rep: int) -> dict[str, Any]:
    """Run one repetition of a group and check every written ID."""
    group.start.wait(timeout=120)
    group.done.wait(timeout=duration + 120)
    records = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(group.out_dir.glob(f"{rep}-*.json"))
    ]
    written: dict[int, str] = {}
    for rec in records:
        if rec["role"] == "writer":
            for offset, mid in enumerate(rec["ids"]):
                written[int(mid)] = _mp_body(rec["index"], rec["first_seq"] + offset)
    claimed_window = [
        tuple(x) for rec in records if rec["role"] == "claimer" for x in rec["window"]
    ]
    claimed_late = [tuple(x) for rec in records if rec["role"] == "claimer" for x in rec["late"]]
    claimed = claimed_window + claimed_late
    ids = [int(mid) for _, mid in claimed]
    unique = set(ids)
    corrupt = sum(1 for body, mid in claimed if written.get(int(mid)) != body)
    writes = len(written)
    return {
        "section": "backend",
        "op": "multiprocess",
        "entry": group.name,
        "rep": rep,
        "duration_s": duration,
        "writes": writes,
        "claims_in_window": len(claimed_window),
        "claims_after_window": len(claimed_late),
        "write_per_s": writes / duration,
        "claim_per_s": len(claimed_window) / duration,
        "ops_per_s": (writes + len(claimed_window)) / duration,
        "lost": len(set(written) - unique),
        "duplicated": len(ids) - len(unique),
        "corrupt_or_foreign": corrupt,
    }


def run_multiprocess(ctx: Context) -> dict[str, Any]:
    """4 writer + 2 claimer processes: aggregate rate, lost and duplicated IDs."""
    duration = 2.0 if ctx.quick else 20.0
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in ENTRIES}
    ctx.progress.note("multiprocess: spawning 18 processes")
    groups = {name: mp_spawn(ctx, name, duration) for name in ENTRIES}
    completed = False
    try:
        for rep in range(ctx.reps):
            for name in rotated(list(ENTRIES), rep):
                ctx.progress.note(
                    f"4 writers + 2 claimers / {name} rep {rep + 1} ({duration:.0f} s)"
                )
                sample = mp_sample(ctx, groups[name], duration, rep)
                samples[name].append(sample)
                ctx.emit(sample)
                ctx.progress.step(f"multiprocess / {name} rep {rep + 1}")
        completed = True
    finally:
        for group in groups.values():
            if not completed:  # children blocked on a barrier get BrokenBarrierError
                group.start.abort()
                group.done.abort()
            for proc in group.procs:
                proc.join(10 if completed else 2)
                if proc.is_alive():
                    proc.kill()
            group.cleanup()
    return {
        "duration_s": duration,
        **{
            name: {
                **{
                    k: median(s[k] for s in got)
                    for k in ("ops_per_s", "write_per_s", "claim_per_s")
                },
                "lost": sum(s["lost"] for s in got),
                "duplicated": sum(s["duplicated"] for s in got),
                "corrupt_or_foreign": sum(s["corrupt_or_foreign"] for s in got),
                "messages": sum(s["writes"] for s in got),
            }
            for name, got in samples.items()
        },
    }


# -- driver --------------------------------------------------------------------------------------


def plan_units(reps: int, parts: set[str]) -> int:
    """Return how many progress units the selected parts take."""
    units = 0
    if "ops" in parts:
        for op in OPS:
            entries = 1 if op.key in RAW_ONLY else (3 if op.raw == "" else 2)
            units += entries * reps
    if "watcher" in parts:
        units += 3 * reps
    if "leases" in parts:
        units += len(LEASE_OPS) * reps
    if "keep_newest" in parts:
        units += 2 * reps
    if "multiprocess" in parts:
        units += 3 * reps * MP_WEIGHT
    return units


#: Progress units of one multi-process sample (about 40 ops samples' time).
MP_WEIGHT = 40

BACKEND_PARTS = ("ops", "leases", "keep_newest", "watcher", "multiprocess")


def run_section(
    server: Server,
    *,
    reps: int,
    quick: bool,
    progress: Progress,
    emit: Callable[[dict[str, Any]], None],
    parts: set[str],
) -> dict[str, Any]:
    """Run the backend section; return its summary."""
    workdir = Path(tempfile.mkdtemp(prefix="sbbench-"))
    ctx = Context(server, reps, quick, progress, emit, workdir)
    ctx.entries = {
        REDIS: SBEntry(REDIS, server.url, workdir),
        SQLITE: SBEntry(SQLITE, server.url, workdir),
        RAW: RawEntry(server.url),
    }
    out: dict[str, Any] = {"timings_s": {}}
    runners: dict[str, Callable[[Context], Any]] = {
        "ops": lambda c: run_throughput(c, OPS),
        "leases": run_leases,
        "keep_newest": run_keep_newest,
        "watcher": run_watcher,
    }
    try:
        t0 = time.monotonic()
        warm_up(ctx)
        out["timings_s"]["warm_up"] = time.monotonic() - t0
        for part, runner in runners.items():
            if part in parts:
                t0 = time.monotonic()
                out[part] = runner(ctx)
                out["timings_s"][part] = time.monotonic() - t0
        if "multiprocess" in parts:
            t0 = time.monotonic()
            original = progress.step

            def weighted(label: str, weight: int = 1) -> None:
                original(label, weight * MP_WEIGHT)

            progress.step = weighted  # type: ignore[method-assign]
            try:
                out["multiprocess"] = run_multiprocess(ctx)
            finally:
                progress.step = original  # type: ignore[method-assign]
            out["timings_s"]["multiprocess"] = time.monotonic() - t0
    finally:
        ctx.entries[RAW].close()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def warm_up(ctx: Context) -> None:
    """Load every script once and import everything (untimed, results discarded)."""
    ctx.progress.note("warming up")
    for op in OPS:
        for name in [RAW] if op.key in RAW_ONLY else [REDIS, SQLITE, RAW]:
            if op.raw != "" and name == RAW:
                continue
            prepared = ctx.entries[name].prepare(op, 3)
            try:
                prepared.run()
            finally:
                prepared.cleanup()
    for key, _, _ in LEASE_OPS:
        prepared = _lease_prepared(ctx, key, 3)
        try:
            prepared.run()
        finally:
            prepared.cleanup()


# -- reporting -------------------------------------------------------------------------------------


def throughput_rows(ops: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Rows of the side-by-side rate table."""
    headers = ["operation", "unit", "redis", "sqlite", "raw limit", "redis/raw", "sqlite/raw"]
    rows = []
    for key, res in in_order(ops, [op.key for op in OPS]):
        med = res["median"]
        unit = "msgs/s" if res["msgs"] > 1 else "ops/s"
        field_ = "msgs_per_s" if res["msgs"] > 1 else "ops_per_s"
        raw_key = res["raw_key"]
        raw_rate = (
            ops.get(raw_key, {}).get("median", {}).get(RAW, {}).get(field_) if raw_key else None
        )

        def rate(name: str, med: dict[str, Any] = med, field_: str = field_) -> float | None:
            return med.get(name, {}).get(field_)

        def ratio(value: float | None, raw_rate: float | None = raw_rate) -> float | None:
            return value / raw_rate if value and raw_rate else None

        label = res["label"]
        if raw_key and raw_key != key:
            label += f" (raw: {raw_key})"
        invalid = [name for name, ok in res["valid"].items() if not ok]
        if invalid:
            label += " [INVALID: " + ",".join(invalid) + "]"
        rows.append(
            [
                label,
                unit,
                fmt_num(rate(REDIS)),
                fmt_num(rate(SQLITE)),
                fmt_num(raw_rate),
                fmt_ratio(ratio(rate(REDIS))),
                fmt_ratio(ratio(rate(SQLITE))),
            ]
        )
    return headers, rows


def count_rows(ops: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Rows of the per-operation Redis work table, ``redis / raw`` in each cell."""
    headers = [
        "operation",
        "RT/op",
        "client cmds/op",
        "server cmds/op",
        "script us/op",
        "server CPU us/op",
        "client CPU us/op",
    ]
    rows = []
    for key, res in in_order(ops, [op.key for op in OPS]):
        counts = res["counts"]
        ours = counts.get(REDIS, {})
        same_raw = res["raw_key"] == key
        raw_count = counts.get(RAW, {}) if same_raw else {}
        med = res["median"].get(REDIS, {})
        raw_med = res["median"].get(RAW, {}) if same_raw else {}

        def pair(a: float | None, b: float | None) -> str:
            return f"{fmt_num(a)} / {fmt_num(b)}"

        rows.append(
            [
                res["label"],
                pair(ours.get("rt_per_op"), raw_count.get("rt_per_op")),
                pair(ours.get("client_cmds_per_op"), raw_count.get("client_cmds_per_op")),
                pair(med.get("server_cmds_per_op"), raw_med.get("server_cmds_per_op")),
                pair(med.get("script_us_per_op"), raw_med.get("script_us_per_op")),
                pair(med.get("server_cpu_us_per_op"), raw_med.get("server_cpu_us_per_op")),
                pair(med.get("client_cpu_us_per_op"), raw_med.get("client_cpu_us_per_op")),
            ]
        )
    return headers, rows


def lease_rows(leases: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Rows of the reservation table."""
    headers = ["operation", "ops/s", "RT/op", "server cmds/op", "script us/op", "client CPU us/op"]
    rows = []
    for _, res in in_order(leases, [key for key, _, _ in LEASE_OPS]):
        med = res["median"]
        label = res["label"] + ("" if res["valid"] else " [INVALID]")
        rows.append(
            [
                label,
                fmt_num(med["ops_per_s"]),
                fmt_num(res["counts"]["rt_per_op"]),
                fmt_num(med["server_cmds_per_op"]),
                fmt_num(med["script_us_per_op"]),
                fmt_num(med["client_cpu_us_per_op"]),
            ]
        )
    return headers, rows


def report(summary: dict[str, Any], markdown: bool = False) -> str:
    """Render the backend section's tables."""
    parts = []
    if "ops" in summary:
        headers, rows = throughput_rows(summary["ops"])
        parts.append(
            "Throughput (median of interleaved reps; ratios to the raw one-round-trip limit)\n\n"
            + render_table(headers, rows, markdown)
        )
        headers, rows = count_rows(summary["ops"])
        parts.append(
            "Redis work per operation, redis / raw (RT = client round trips; server cmds "
            "count EVALSHA once plus every command Lua runs inside; script us = EVALSHA "
            "time from commandstats; CPU = process CPU time per op)\n\n"
            + render_table(headers, rows, markdown)
        )
    if "leases" in summary:
        headers, rows = lease_rows(summary["leases"])
        parts.append(
            "Reservations (simplebroker_redis.Leases)\n\n" + render_table(headers, rows, markdown)
        )
    if "keep_newest" in summary:
        kn = summary["keep_newest"]
        rows = [
            [
                name,
                fmt_num(kn[name]["wall_ms"]),
                fmt_num(kn[name]["server_ms"]),
                "yes" if kn[name]["valid"] else "NO",
            ]
            for name in (REDIS, SQLITE)
        ]
        parts.append(
            f"write(body, keep_newest=1) displacing {kn['rows']:,} pending rows\n\n"
            + render_table(["backend", "wall ms", "server (script) ms", "1 left"], rows, markdown)
        )
    if "watcher" in summary:
        w = summary["watcher"]
        rows = [
            [
                name,
                fmt_num(w[name]["p50_ms"]),
                fmt_num(w[name]["p99_ms"]),
                fmt_num(w[name]["max_ms"]),
            ]
            for name in ENTRIES
        ]
        idle = w.get("idle_cmds_per_s")
        parts.append(
            "Watcher write-to-handler latency "
            "(QueueWatcher; raw = Pub/Sub thread + claim script)\n\n"
            + render_table(["backend", "p50 ms", "p99 ms", "max ms"], rows, markdown)
            + f"\n\nIdle QueueWatcher: {fmt_num(idle)} server commands/s "
            "(INFO stats total_commands_processed, nothing else connected)"
        )
    if "multiprocess" in summary:
        m = summary["multiprocess"]
        raw_rate = m[RAW]["ops_per_s"]
        rows = [
            [
                name,
                fmt_num(m[name]["ops_per_s"]),
                fmt_num(m[name]["write_per_s"]),
                fmt_num(m[name]["claim_per_s"]),
                fmt_ratio(m[name]["ops_per_s"] / raw_rate if raw_rate else None),
                f"{m[name]['lost']}",
                f"{m[name]['duplicated']}",
                f"{m[name]['corrupt_or_foreign']}",
                f"{m[name]['messages']:,}",
            ]
            for name in ENTRIES
        ]
        parts.append(
            f"4 writer + 2 claimer processes, {m['duration_s']:.0f} s per rep "
            "(lost/duplicated summed over all reps)\n\n"
            + render_table(
                [
                    "backend",
                    "ops/s",
                    "writes/s",
                    "claims/s",
                    "vs raw",
                    "lost",
                    "dup",
                    "corrupt",
                    "messages",
                ],
                rows,
                markdown,
            )
        )
    return "\n\n".join(parts)
