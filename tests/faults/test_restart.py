"""Server crashes and restarts: durability per persistence setting, and recovery.

The README's durability table is checked row by row against a real server
that is SIGKILLed (a crash of the server process) or stopped cleanly, then
started again on the same port and data directory: no persistence loses
everything; RDB loses what came after the last snapshot on a crash but
nothing on a clean stop; AOF (``always``, and even ``no``) loses no
acknowledged change when only the server process dies. What an OS crash or
power loss costs (``everysec``, ``no``) cannot be produced here.
Handles opened before the restart, SimpleBroker's QueueWatcher and a Taskiq
worker must carry on without intervention.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from simplebroker import BrokerTarget, Queue, QueueWatcher, resolve_config

from simplebroker_redis import Leases, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from support.invariants import check_invariants
from support.waiting import wait_for

from .workers import events, start_worker

NO_MAINTENANCE = resolve_config(override={"BROKER_AUTO_VACUUM": 0})
AOF_ALWAYS = {"appendonly": True, "extra_args": ["--appendfsync", "always"]}


def _core(url: str, namespace: str = "durable") -> RedisBrokerCore:
    runner = RedisRunner(url, namespace=namespace, stale_batch_seconds=1.0)
    return RedisBrokerCore(runner, config=NO_MAINTENANCE, owns_runner=True)


def _restart(
    make_server: Callable[..., DevServer], old: DevServer, *, crash: bool, **kwargs: Any
) -> DevServer:
    if crash:
        old.kill()
    else:
        old.stop(remove_data=False)
    return make_server("srv", port=old.port, **kwargs)


class Load:
    """Writers, claimers and lease holders running until the server dies.

    Only operations whose reply arrived are recorded as acknowledged; an
    operation cut off by the crash has an unknown outcome.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.written: dict[int, str] = {}
        self.unknown_bodies: set[str] = set()
        self.claimed: set[int] = set()
        self.acked: set[int] = set()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._guard, args=(body,), daemon=True)
            for body in (self._write, self._write, self._claim, self._lease)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive()

    def _guard(self, body: Callable[[RedisBrokerCore], None]) -> None:
        core = _core(self.url)
        try:
            body(core)
        except Exception:  # noqa: BLE001 - the crash ends every loop with an error
            pass
        finally:
            core.shutdown()

    def _write(self, core: RedisBrokerCore) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"{threading.get_ident()}-{n}"
            n += 1
            self.unknown_bodies.add(body)
            self.written[core.write("jobs", body)] = body
            self.unknown_bodies.discard(body)

    def _claim(self, core: RedisBrokerCore) -> None:
        while not self.stop.is_set():
            row = core.claim_one("jobs")
            if row is not None:
                self.claimed.add(row[1])

    def _lease(self, core: RedisBrokerCore) -> None:
        leases = Leases(core.runner)
        while not self.stop.is_set():
            lease = leases.reserve("jobs", 3, 1.0)
            if lease.messages:
                leases.ack(lease.token)
                self.acked.update(lease.ids)


@pytest.mark.parametrize(
    ("fsync", "crash"),
    [("always", True), ("always", False), ("no", True)],
    ids=["always-sigkill", "always-clean-stop", "no-sigkill"],
)
def test_aof_keeps_every_acknowledged_change(make_server, fsync, crash):
    # appendfsync no: the AOF is written (not fsynced) before each reply, so a
    # crash of the server process alone loses nothing; only the OS can.
    aof = {"appendonly": True, "extra_args": ["--appendfsync", fsync]}
    server = make_server("srv", **aof)
    survivor = _core(server.url)  # opened before the restart, used after it
    survivor.write("jobs", "before the load")
    load = Load(server.url)
    load.start()
    wait_for(lambda: len(load.written) >= 200 and load.claimed and load.acked, 60, what="load")
    server = _restart(make_server, server, crash=crash, **aof)
    load.join()

    raw = redis.Redis.from_url(server.url, decode_responses=True)
    check_invariants(raw, "durable")
    stored = {i: b for b, i in survivor.peek_many("jobs", 100_000, include_claimed=True)}
    pending = {i for _, i in survivor.peek_many("jobs", 100_000)}
    missing = {i: b for i, b in load.written.items() if stored.get(i) != b}
    assert not missing, f"{len(missing)} acknowledged writes lost or changed"
    assert not (load.claimed | load.acked) & pending, "an acknowledged claim was undone"
    assert load.claimed | load.acked <= set(stored)
    bodies = sorted(stored.values())
    assert len(bodies) == len(set(bodies)), "a write was applied twice"
    assert set(bodies) <= set(load.written.values()) | load.unknown_bodies | {"before the load"}
    newest = max(load.written)
    assert int(raw.hget("sb:{durable}:meta", "last_ts")) >= newest
    # Handles opened before the restart carry on, and IDs keep increasing.
    assert survivor.write("jobs", "after") > newest
    fresh = _core(server.url)
    assert fresh.write("jobs", "fresh") > newest
    # A reservation cut off by the crash comes back after its lease.
    time.sleep(1.1)
    fresh.recover_stale()
    fresh.claim_many("jobs", 100_000)
    assert fresh.get_queue_stat("jobs").pending == 0
    assert raw.zcard("sb:{durable}:reserved") == 0
    check_invariants(raw, "durable")
    fresh.shutdown()
    survivor.shutdown()
    raw.close()


def test_no_persistence_loses_everything_and_the_namespace_comes_back(make_server):
    server = make_server("srv")  # DevServer default: save "" and appendonly no
    core = _core(server.url)
    first = core.write("jobs", "gone")
    server = _restart(make_server, server, crash=True)
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    assert raw.dbsize() == 0
    # The surviving handle re-creates the namespace by itself and keeps its
    # IDs increasing (its cached high-water outlives the server's).
    assert core.write("jobs", "new") > first
    assert core.peek_many("jobs", 10, with_timestamps=False) == ["new"]
    check_invariants(raw, "durable")
    core.shutdown()
    raw.close()


@pytest.mark.parametrize("crash", [True, False], ids=["sigkill", "clean-stop"])
def test_rdb_snapshots_lose_what_came_after_the_last_snapshot_on_a_crash(make_server, crash):
    rdb = {"extra_args": ["--save", "3600 1"]}  # snapshots only when asked, or at shutdown
    server = make_server("srv", **rdb)
    core = _core(server.url)
    kept = core.write("jobs", "snapshotted")
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    raw.bgsave()
    wait_for(lambda: raw.info("persistence")["rdb_bgsave_in_progress"] == 0, 30)
    later = core.write("jobs", "after the snapshot")
    raw.close()
    server = _restart(make_server, server, crash=crash, **rdb)
    rows = core.peek_many("jobs", 10)
    if crash:
        assert rows == [("snapshotted", kept)]
    else:
        # A clean stop writes a final snapshot: nothing is lost.
        assert rows == [("snapshotted", kept), ("after the snapshot", later)]
    core.shutdown()


def test_at_least_once_batch_survives_a_restart_and_commits_after_it(make_server):
    server = make_server("srv", **AOF_ALWAYS)
    core = _core(server.url)
    ids = [core.write("jobs", f"m{i}") for i in range(4)]
    gen = core.claim_generator("jobs", delivery_guarantee="at_least_once", batch_size=4)
    seen = [next(gen) for _ in range(2)]
    server = _restart(make_server, server, crash=True, **AOF_ALWAYS)
    seen += list(gen)  # the rest of the batch, then the commit, after the restart
    assert [i for _, i in seen] == ids
    stat = core.get_queue_stat("jobs")
    assert (stat.pending, stat.claimed) == (0, 4)
    core.shutdown()


def test_queue_watcher_carries_on_after_the_server_restarts(make_server):
    server = make_server("srv", **AOF_ALWAYS)
    target = BrokerTarget("redis", server.url, {"namespace": "watched"})
    writer = _core(server.url, "watched")
    received: list[str] = []
    arrived = threading.Condition()

    def handler(body: str, _id: int) -> None:
        with arrived:
            received.append(body)
            arrived.notify_all()

    def wait_received(count: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(received) >= count, 20), received

    queue = Queue("jobs", db_path=target)
    watcher = QueueWatcher(queue, handler)
    thread = watcher.run_in_thread()
    try:
        writer.write("jobs", "before")
        wait_received(1)
        server.stop(remove_data=False)
        # The watcher's drains fail meanwhile; SimpleBroker's QueueWatcher
        # gives up after three failed attempts (about 6 s), see the report.
        time.sleep(3.0)
        server = make_server("srv", port=server.port, **AOF_ALWAYS)
        writer.write("jobs", "after")
        wait_received(2)
        assert received == ["before", "after"]
        assert thread.is_alive()
    finally:
        watcher.stop()
        thread.join(timeout=10)
        queue.close()
        writer.shutdown()


async def test_taskiq_worker_carries_on_after_a_long_server_outage(make_server, tmp_path):
    from taskiq.kicker import AsyncKicker

    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    server = make_server("srv", **AOF_ALWAYS)
    log = tmp_path / "tasks.log"
    worker = start_worker(server.url, "outage", log, tmp_path / "worker.out")

    async def kick(key: str) -> None:
        producer = SimpleBrokerTaskiqBroker(server.url, namespace="outage", queue="work")
        await producer.startup()
        try:
            await AsyncKicker("faults:work", producer, {}).kiq(key, 0.0)
        finally:
            await producer.shutdown()

    async def done(key: str) -> None:
        deadline = time.monotonic() + 30
        while ("done", key) not in {(e, k) for e, k, _ in events(log)}:
            assert worker.alive(), "the worker exited"
            assert time.monotonic() < deadline, f"{key} was not done"
            await asyncio.sleep(0.05)

    try:
        await kick("before")
        await done("before")
        server.stop(remove_data=False)
        # Longer than the worker's lease (1 s) and several reconnect backoffs.
        await asyncio.sleep(4.0)
        server = make_server("srv", port=server.port, **AOF_ALWAYS)
        await kick("after")
        await done("after")
        assert len({pid for _, _, pid in events(log)}) == 1, "the worker process was replaced"
        assert worker.alive()
    finally:
        worker.stop(10)
