"""The server drops the backend's connections in the middle of operations.

Three real faults, each against every operation that changes state:

- *before*: ``CLIENT PAUSE WRITE`` holds the operation's script at the
  server, ``CLIENT KILL ID`` drops the connection, the script never runs;
- *after*: a tiny ``client-output-buffer-limit`` makes the server close the
  connection right after the script ran, so the reply is lost;
- *racing*: the server is held busy while the operation and a ``CLIENT
  KILL`` queue up, so either may win.

Each time the stored state must be exactly the state before the operation,
or exactly the state a fault-free run of it produces on identical data (a
twin namespace), and the next operation on the same handle must succeed.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from simplebroker import resolve_config
from simplebroker.ext import OperationalError, TimestampError

from simplebroker_redis import (
    AsyncLeases,
    AsyncMessages,
    AsyncRedisRunner,
    Leases,
    RedisRunner,
    redis_backend_plugin,
)
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from simplebroker_redis.namespace import cleanup
from simplebroker_redis.runner import direct
from support.invariants import canonical, check_invariants
from support.state import snapshot
from support.waiting import wait_for

from .faulthelpers import backend_connections

NO_MAINTENANCE = resolve_config(override={"BROKER_AUTO_VACUUM": 0})

#: What a lost connection raises (SimpleBroker's ID generator reports an
#: unknown durable outcome as TimestampError).
LOST = (OperationalError, TimestampError)


@dataclass
class World:
    """One namespace filled with every message state, and handles on it."""

    namespace: str
    core: RedisBrokerCore
    leases: Leases
    base: int
    token_r: str = ""
    generators: list[Any] | None = None
    closed: bool = False

    @property
    def ids(self) -> list[int]:
        return [self.base + n for n in range(1, 9)] + [self.base + 100]

    def connection_id(self) -> str:
        """Return the server's ID of the idle connection the next script uses.

        Asked on the path scripts take (:func:`direct`): it hands out the
        connection it was last given back, as the pool does.
        """
        return str(direct(self.core.runner.client, ("CLIENT", "ID")))

    def close(self) -> None:
        """Close suspended generators, delete the namespace, close the pool (once)."""
        if self.closed:
            return
        self.closed = True
        for gen in self.generators or []:
            gen.close()
        self.generators = []
        cleanup(self.core.runner)
        self.core.shutdown()


def _build(url: str, base: int) -> World:
    namespace = f"cf-{uuid.uuid4().hex[:10]}"
    runner = RedisRunner(url, namespace=namespace, stale_batch_seconds=300)
    core = RedisBrokerCore(runner, config=NO_MAINTENANCE, owns_runner=True)
    leases = Leases(runner)
    b = base
    core.insert_messages(
        [
            ("q", "q1", b + 1),
            ("q", "q2", b + 2),
            ("q", "q3", b + 3),
            ("q", "q4", b + 4),
            ("other", "o1", b + 5),
            ("r", "r1", b + 6),
            ("r", "r2", b + 7),
            ("d", "d1", b + 8),
        ]
    )
    core.claim_one("q", exact_timestamp=b + 4)
    world = World(namespace, core, leases, base, generators=[])
    world.token_r = leases.reserve("r", 2, 60).token
    delayed = leases.reserve("d", 1, 60)
    leases.release(delayed.token, delay_seconds=600)
    core.add_alias("al", "q")
    return world


def _generator_step(world: World) -> Any:
    gen = world.core.claim_generator("q", delivery_guarantee="at_least_once", batch_size=2)
    assert world.generators is not None
    world.generators.append(gen)  # kept suspended: its batch stays reserved
    return next(gen)


Operation = Callable[[World], Any]

#: Every state-changing operation of the core, the lease API and the generators.
OPERATIONS: dict[str, Operation] = {
    "write": lambda w: w.core.write("q", "new"),
    "write_keep_newest": lambda w: w.core.write("q", "new", keep_newest=1),
    "write_delayed": lambda w: w.core.write_delayed("q", "later", 600),
    "insert": lambda w: w.core.insert_messages([("q", "ins", w.base + 100)]),
    "broadcast": lambda w: w.core.broadcast("to all"),
    "broadcast_pattern": lambda w: w.core.broadcast("to o*", pattern="o*"),
    "claim_one": lambda w: w.core.claim_one("q"),
    "claim_many": lambda w: w.core.claim_many("q", 2),
    "move_one": lambda w: w.core.move_one("q", "dst"),
    "move_many": lambda w: w.core.move_many("q", "dst", 5),
    "delete_queue": lambda w: w.core.delete("q"),
    "delete_ids": lambda w: w.core.delete_message_ids("q", [w.base + 1]),
    "delete_from_queues": lambda w: w.core.delete_from_queues(["q", "other"]),
    "rename": lambda w: w.core.rename_queue("q", "q2"),
    "alias_add": lambda w: w.core.add_alias("al2", "other"),
    "alias_remove": lambda w: w.core.remove_alias("al"),
    "vacuum": lambda w: w.core.vacuum(),
    "generate_timestamp": lambda w: w.core.generate_timestamp(),
    "reserve": lambda w: w.leases.reserve("q", 2, 60),
    "ack": lambda w: w.leases.ack(w.token_r),
    "ack_one": lambda w: w.leases.ack(w.token_r, [w.base + 6]),
    "reject": lambda w: w.leases.reject(w.token_r, None, "dead"),
    "release": lambda w: w.leases.release(w.token_r),
    "release_delayed": lambda w: w.leases.release(w.token_r, delay_seconds=600),
    "renew": lambda w: w.leases.renew([w.token_r], 120),
    "generator_batch": _generator_step,
}

#: Operations that start with a read-only script (retried once after a connection error).
RETRIED_READ_FIRST = {"alias_add"}

#: Operations whose script replies with a non-empty array (see test_reply_lost...).
ARRAY_REPLIES = {
    "broadcast",
    "broadcast_pattern",
    "claim_one",
    "claim_many",
    "move_one",
    "move_many",
    "rename",
    "reserve",
    "ack",
    "ack_one",
    "reject",
    "generator_batch",
}


@pytest.fixture
def worlds(module_server: DevServer, module_raw: redis.Redis) -> Iterator[Callable[[], World]]:
    """Factory of identically filled namespaces (same IDs, same states)."""
    base = (time.time_ns() - 60 * 10**9) & ~0xFFF
    made: list[World] = []

    def factory() -> World:
        world = _build(module_server.url, base)
        made.append(world)
        return world

    yield factory
    for world in made:
        world.close()


def _after_state(worlds: Callable[[], World], module_raw: redis.Redis, name: str) -> Any:
    twin = worlds()
    OPERATIONS[name](twin)
    state = canonical(snapshot(module_raw, twin.namespace), twin.ids)
    twin.close()  # its connections must not be mistaken for the faulted world's
    return state


def _next_operation_succeeds(world: World, module_raw: redis.Redis) -> None:
    for gen in world.generators or []:
        gen.close()  # a core refuses writes while its own batch is being yielded
    message_id = world.core.write("other", "next")
    assert world.core.peek_one("other", exact_timestamp=message_id) == ("next", message_id)
    assert world.core.claim_one("other", exact_timestamp=message_id) == ("next", message_id)
    check_invariants(module_raw, world.namespace)


def _run_in_thread(operation: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = operation()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_connection_killed_before_the_script_runs(name, worlds, module_raw):
    expected_after = _after_state(worlds, module_raw, name)
    world = worlds()
    connection = world.connection_id()
    before = snapshot(module_raw, world.namespace)
    module_raw.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    try:
        thread, outcome = _run_in_thread(lambda: OPERATIONS[name](world))
        wait_for(
            lambda: any(
                c["id"] == connection and "b" in c["flags"] for c in backend_connections(module_raw)
            ),
            timeout=20,
            what="the operation's script to be held by CLIENT PAUSE",
        )
        assert module_raw.client_kill_filter(_id=connection) == 1
    finally:
        module_raw.execute_command("CLIENT", "UNPAUSE")
    thread.join(timeout=30)
    assert not thread.is_alive()
    if "error" in outcome:
        assert isinstance(outcome["error"], LOST), outcome
        assert snapshot(module_raw, world.namespace) == before, "a killed operation left a change"
    else:
        # Only a read-only script was killed (add_alias probes first); it is
        # retried once, and the operation then completed.
        assert name in RETRIED_READ_FIRST, outcome
        assert canonical(snapshot(module_raw, world.namespace), world.ids) == expected_after
    if "error" in outcome:
        OPERATIONS[name](world)  # the same operation, retried on the same handle, works
        assert canonical(snapshot(module_raw, world.namespace), world.ids) == expected_after
    _next_operation_succeeds(world, module_raw)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_reply_lost_after_the_script_ran(name, worlds, module_raw):
    # Scripts replying with an array use a deferred-length reply block that
    # counts against client-output-buffer-limit; with a 1 KiB hard limit the
    # server runs the script, then closes the connection instead of replying.
    expected = _after_state(worlds, module_raw, name)
    world = worlds()
    module_raw.config_set("client-output-buffer-limit", "normal 1024 0 0")
    try:
        thread, outcome = _run_in_thread(lambda: OPERATIONS[name](world))
        thread.join(timeout=30)
    finally:
        module_raw.config_set("client-output-buffer-limit", "normal 0 0 0")
    assert not thread.is_alive()
    if name in ARRAY_REPLIES:
        assert isinstance(outcome.get("error"), LOST), outcome
    assert canonical(snapshot(module_raw, world.namespace), world.ids) == expected
    _next_operation_succeeds(world, module_raw)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_kill_racing_the_operation_leaves_before_or_after(name, worlds, module_server, module_raw):
    expected_after = _after_state(worlds, module_raw, name)
    world = worlds()
    before = canonical(snapshot(module_raw, world.namespace), world.ids)
    connection = world.connection_id()  # the operation checks out this idle connection
    blocker = redis.Redis.from_url(module_server.url)
    # Hold the server 0.3 s: the operation and the kill both queue behind it.
    hold = threading.Thread(target=blocker.execute_command, args=("DEBUG", "SLEEP", 0.3))
    hold.start()
    time.sleep(0.05)
    thread, outcome = _run_in_thread(lambda: OPERATIONS[name](world))
    time.sleep(0.05)
    module_raw.client_kill_filter(_id=connection)
    hold.join(timeout=30)
    thread.join(timeout=30)
    blocker.close()
    assert not thread.is_alive()
    error = outcome.get("error")
    assert error is None or isinstance(error, LOST), outcome
    state = canonical(snapshot(module_raw, world.namespace), world.ids)
    assert state in (before, expected_after), "neither the state before nor after"
    if error is None:
        assert state == expected_after
    _next_operation_succeeds(world, module_raw)


@pytest.mark.parametrize("name", ["write", "claim_one", "reserve", "ack", "generator_batch"])
def test_pooled_connection_killed_while_idle_is_replaced(name, worlds, module_raw):
    expected = _after_state(worlds, module_raw, name)
    world = worlds()
    connection = world.connection_id()
    assert module_raw.client_kill_filter(_id=connection) == 1
    OPERATIONS[name](world)  # not retried by us: redis-py replaces the dead socket
    assert canonical(snapshot(module_raw, world.namespace), world.ids) == expected
    _next_operation_succeeds(world, module_raw)


# -- pool exhaustion -------------------------------------------------------------------


def _hold_connections(runner: RedisRunner, count: int, seconds: float) -> list[threading.Thread]:
    """Check out ``count`` pooled connections for ``seconds`` (blocked in BLPOP)."""
    key = runner.keys.prefix + "hold"
    holders = [
        threading.Thread(
            target=runner.execute, args=(lambda client: client.blpop([key], timeout=seconds),)
        )
        for _ in range(count)
    ]
    for holder in holders:
        holder.start()
    return holders


def _blocked_pops(raw: redis.Redis) -> int:
    """Return how many of this process's connections are blocked in BLPOP right now."""
    return sum(c["cmd"] == "blpop" and "b" in c["flags"] for c in backend_connections(raw))


def test_pool_exhaustion_is_a_retryable_error_within_pool_timeout(module_server, module_raw):
    namespace = f"pool-{uuid.uuid4().hex[:10]}"
    runner = RedisRunner(
        module_server.url, namespace=namespace, max_connections=2, pool_timeout=0.5
    )
    core = RedisBrokerCore(runner, config=NO_MAINTENANCE, owns_runner=True)
    core.write("jobs", "before")
    holders = _hold_connections(runner, 2, 3)
    wait_for(lambda: _blocked_pops(module_raw) == 2, 10, what="both connections held")
    try:
        for operation in (lambda: core.write("jobs", "x"), lambda: core.peek_many("jobs", 5)):
            started = time.monotonic()
            with pytest.raises(OperationalError, match="exhausted") as info:
                operation()
            waited = time.monotonic() - started
            assert 0.45 <= waited < 2.5, waited
            assert info.value.retryable is True
    finally:
        for holder in holders:
            holder.join(10)
    # The connections came back: the same handle works again.
    assert core.peek_many("jobs", 5, with_timestamps=False) == ["before"]
    core.write("jobs", "after")
    check_invariants(module_raw, namespace)
    cleanup(runner)
    core.shutdown()


async def test_async_pool_exhaustion_is_a_retryable_error_within_pool_timeout(
    module_server, module_raw
):
    namespace = f"apool-{uuid.uuid4().hex[:10]}"
    runner = AsyncRedisRunner(
        module_server.url, namespace=namespace, max_connections=1, pool_timeout=0.5
    )
    await runner.ensure_initialized()
    key = runner.keys.prefix + "hold"
    holder = asyncio.create_task(runner.execute(lambda client: client.blpop([key], timeout=3)))
    while not _blocked_pops(module_raw):
        await asyncio.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(OperationalError, match="exhausted") as info:
        await AsyncLeases(runner).reserve("jobs", 1, 30)
    assert 0.45 <= time.monotonic() - started < 2.0
    assert info.value.retryable is True
    await holder
    await AsyncMessages(runner).write("jobs", "after")
    assert (await AsyncLeases(runner).reserve("jobs", 1, 30)).messages
    await runner.aclose()
    cleanup(runner.sync)


def test_one_connection_serves_nested_generators_waiters_and_threads(module_server, module_raw):
    namespace = f"nest-{uuid.uuid4().hex[:10]}"
    runner = RedisRunner(module_server.url, namespace=namespace, max_connections=1, pool_timeout=20)
    reader = RedisBrokerCore(runner, config=NO_MAINTENANCE)
    writer = RedisBrokerCore(runner, config=NO_MAINTENANCE)
    for i in range(12):
        writer.write("jobs", f"m{i}")
    waiter = redis_backend_plugin.create_activity_waiter(
        target=None, runner=runner, queue_name="echo", stop_event=threading.Event()
    )
    assert waiter is not None
    seen = []
    for body in reader.claim_generator(
        "jobs", delivery_guarantee="at_least_once", batch_size=5, with_timestamps=False
    ):
        # Inside the batch: other handles on the same one-connection pool.
        writer.write("echo", body)
        assert writer.peek_many("echo", 100, with_timestamps=False)[-1] == body
        seen.append(body)
    assert seen == [f"m{i}" for i in range(12)]
    waiter.close()

    errors: list[BaseException] = []

    def hammer(n: int) -> None:
        try:
            for i in range(15):
                writer.write("load", f"{n}-{i}")
                writer.claim_one("load")
                list(
                    writer.claim_generator("load", delivery_guarantee="at_least_once", batch_size=2)
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "deadlocked"
    assert errors == []
    assert writer.get_queue_stat("load").pending == 0
    check_invariants(module_raw, namespace)
    cleanup(runner)
    runner.shutdown()
