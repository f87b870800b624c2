"""Run every operation of the backend once, for the ACL, TLS and key-name tests.

:func:`exercise` drives each Lua script, every direct command, the Pub/Sub
listener, SimpleBroker's ``Queue``/``QueueWatcher``, the asyncio API and the
Taskiq broker, result backend and schedule source, against one target and
namespace. Queue names are parameters so the key-name test can pass
hostile-looking (but valid) ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from simplebroker import BrokerTarget, Queue, QueueWatcher, resolve_config

from simplebroker_redis import (
    AsyncLeases,
    AsyncMessages,
    AsyncRedisRunner,
    Leases,
    RedisRunner,
    calls,
    redis_backend_plugin,
)
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.ops.observe import read_namespace
from simplebroker_redis.taskrecord import TaskRecord
from simplebroker_redis.types import ValueWrite


@dataclass(frozen=True)
class Names:
    """Queue names used by :func:`exercise` (all must be valid queue names)."""

    main: str = "jobs"
    other: str = "other"
    target: str = "moved"
    dead: str = "dead"
    alias: str = "shortcut"
    task_id: str = "task-1"


def exercise(
    url: str,
    namespace: str,
    names: Names = Names(),
    *,
    cleanup: bool = True,
    scripting: str = "functions",
) -> None:
    """Run every operation on ``namespace`` at ``url``; raise on the first failure."""
    options = {"namespace": namespace, "scripting": scripting}
    plugin = redis_backend_plugin
    plugin.initialize_target(url, backend_options=options)
    plugin.validate_target(url, backend_options=options)
    runner = RedisRunner(url, namespace=namespace, stale_batch_seconds=0.05, scripting=scripting)
    core = RedisBrokerCore(
        runner, config=resolve_config(override={"BROKER_AUTO_VACUUM": 0}), owns_runner=True
    )
    try:
        _messages(core, names)
        _queues(core, names)
        _reservations(core, names)
        _waiters(url, options, core, names)
        asyncio.run(_asyncio(url, namespace, names, scripting))
        asyncio.run(_taskiq(url, namespace, names, scripting))
    finally:
        core.shutdown()
    if cleanup:
        assert plugin.cleanup_target(url, backend_options=options) is True


def _messages(core: RedisBrokerCore, n: Names) -> None:
    first = core.write(n.main, "one")
    core.write(n.main, "two", keep_newest=10)
    core.write_delayed(n.main, "later", 0.01)
    core.insert_messages([(n.other, "inserted", first - 4096)])
    core.generate_timestamp()
    core.advance_last_timestamp(core.refresh_last_timestamp() + 1)
    core._resync_timestamp_generator()  # noqa: SLF001 - SimpleBroker's repair hook
    assert core.broadcast("to every queue") >= 2
    core.broadcast("to listed", queue_names=[n.main, n.target], create_missing=True)
    core.broadcast("to matching", pattern=n.main[:1] + "*")
    assert core.peek_many(n.main, 10)
    assert core.peek_one(n.main, exact_timestamp=first) == ("one", first)
    assert core.claim_one(n.main) is not None
    assert core.claim_many(n.main, 2)
    core.move_one(n.main, n.target)
    core.move_many(n.other, n.target, 5, require_unclaimed=False)
    assert core.find_message_ids(n.target, body_contains="every")
    assert core.has_pending_messages(n.target)
    core.latest_pending_timestamp(n.target)
    assert core.queue_exists(n.main)


def _queues(core: RedisBrokerCore, n: Names) -> None:
    core.add_alias(n.alias, n.target)
    assert core.resolve_alias(n.alias) == n.target
    core.list_aliases()
    assert core.canonicalize_queue("@" + n.alias) == n.target
    core.remove_alias(n.alias)
    core.list_queues()
    core.list_queues(prefix=n.main[:1])
    core.list_queue_stats()
    core.get_queue_stat(n.main)
    core.get_overall_stats()
    core.status()
    core.get_meta()
    core.write(n.other, "to rename")
    core.rename_queue(n.other, n.other + ".renamed")
    core.delete_message_ids(n.main, [1])
    core.delete_from_queues([n.other + ".renamed"])
    core.vacuum()
    core.delete(n.dead)


def _reservations(core: RedisBrokerCore, n: Names) -> None:
    for i in range(4):
        core.write(n.main, f"r{i}")
    gen = core.claim_generator(n.main, delivery_guarantee="at_least_once", batch_size=2)
    next(gen)
    gen.close()  # rolls the batch back
    assert list(core.claim_generator(n.main, delivery_guarantee="at_least_once"))
    core.write(n.main, "to move")
    assert list(core.move_generator(n.main, n.target, delivery_guarantee="at_least_once"))
    leases = Leases(core.runner)
    core.write(n.main, "leased")
    stale = leases.reserve(n.main, 5, 0.01)
    time.sleep(0.03)
    assert leases.recover().tokens >= 1
    assert core.recover_stale() == 0
    lease = leases.reserve(n.main, 5, 30)
    assert leases.renew([lease.token], 30) == set()
    leases.ack(lease.token, lease.ids[:1])
    leases.release(lease.token, delay_seconds=0.01)
    time.sleep(0.03)
    core.write(n.main, "poison")
    lease = leases.reserve(n.main, 5, 30, max_deliveries=1, dead_letter=n.dead)
    assert lease.messages, "nothing to dead-letter"
    leases.release(lease.token)  # used its one delivery: dead-lettered
    [entry, *_] = leases.dead_letters([n.main]).entries  # ... and journaled
    result = ValueWrite(core.runner.keys.result_key(n.task_id), "dead", 60_000)
    assert leases.dead_letter_ack(entry.entry, result).acked
    core.write(n.main, "rejected")
    lease = leases.reserve(n.main, 5, 30)
    leases.reject(lease.token, None, n.dead)
    leases.deliveries(stale.ids[0])
    _operations(core, n)
    core.delete(n.dead)


def _operations(core: RedisBrokerCore, n: Names) -> None:
    """The scripts of the exporter, the dashboard and the worker heartbeats."""
    runner = core.runner
    state = read_namespace(runner)
    assert n.dead in {depth.queue for depth in state.queues}
    view = runner.run(calls.inspect(n.dead, 10, journal=True))
    first = view.states[0].messages[0].id
    moved = runner.run(calls.dead_letter_requeue(n.dead, n.other, [first]))
    assert moved == 1
    assert runner.run(calls.worker_beat("worker-1", {"pid": 1}, 30)) >= 1
    assert runner.run(calls.worker_beat("worker-1", None, 30)) == 0
    _tasks(core, n)


def _tasks(core: RedisBrokerCore, n: Names) -> None:
    """The task index, the dashboard's task views and the task statistics."""
    runner = core.runner
    key = f"demo:{n.task_id}"
    written = core.write(n.main, "indexed", task_key=key)
    lookup = runner.run(
        calls.task_find(
            [key],
            [(n.main, written)],
            elsewhere=[n.dead],
            result_keys=[runner.keys.result_key(n.task_id)],
        )
    )
    assert [found.id for found in lookup.found] == [written, written]
    assert runner.run(calls.running(10)).total >= 0
    record = TaskRecord(enqueued=1)
    record.run(0.01)
    minute = int(time.time() // 60)
    stats = calls.task_stats([(minute, n.task_id, record)], retention_minutes=10, most_names=10)
    assert runner.run(stats) == 1
    assert runner.run(calls.task_stats_read(minute - 1, minute + 1, totals=True)).totals
    core.delete_message_ids(n.main, [written])


def _waiters(url: str, options: dict[str, Any], core: RedisBrokerCore, n: Names) -> None:
    stop = threading.Event()
    waiter = redis_backend_plugin.create_activity_waiter_for_queues(
        target=url, backend_options=options, queue_names=[n.main, n.other], stop_event=stop
    )
    assert waiter is not None
    try:
        # A waiter may be returned before its SUBSCRIBE took effect (see
        # test_lost_wakeups.py), so keep writing until one wake-up arrives.
        for _ in range(10):
            core.write(n.other, "wake")
            if waiter.wait(1):
                break
        else:
            raise AssertionError("no wake-up in 10 s")
    finally:
        waiter.close()
    received: list[str] = []
    got = threading.Event()
    queue = Queue(n.main, db_path=BrokerTarget("redis", url, options))

    def handler(body: str, _id: int) -> None:
        received.append(body)
        if body == "watched":
            got.set()

    watcher = QueueWatcher(queue, handler)
    thread = watcher.run_in_thread()
    try:
        queue.write("watched")
        assert got.wait(10), received
    finally:
        watcher.stop()
        thread.join(10)
        queue.close()


async def _asyncio(url: str, namespace: str, n: Names, scripting: str) -> None:
    runner = AsyncRedisRunner(url, namespace=namespace, scripting=scripting)
    try:
        await runner.ensure_initialized()
        await AsyncMessages(runner).write(n.main, "async")
        leases = AsyncLeases(runner)
        lease = await leases.reserve(n.main, 10, 30)
        assert lease.messages
        assert await leases.renew([lease.token]) == set()
        await leases.ack(lease.token)
        await AsyncMessages(runner).write(n.other, "async, elsewhere")
        several = await leases.reserve_queues([(n.main, None), (n.other, None)], 10, 30)
        assert several.messages
        for each in several.leases:
            await leases.ack(each.token)
        await leases.recover()
    finally:
        await runner.aclose()


async def _taskiq(url: str, namespace: str, n: Names, scripting: str) -> None:
    from taskiq import ScheduledTask, TaskiqResult
    from taskiq.message import BrokerMessage

    from taskiq_simplebroker import (
        SimpleBrokerResultBackend,
        SimpleBrokerScheduleSource,
        SimpleBrokerTaskiqBroker,
    )

    broker = SimpleBrokerTaskiqBroker(
        runner=AsyncRedisRunner(url, namespace=namespace, scripting=scripting),
        queue=n.main,
        lease_seconds=2.0,
        heartbeat_interval=0.5,
    )
    results: SimpleBrokerResultBackend[Any] = SimpleBrokerResultBackend(runner=broker.runner)
    broker.with_result_backend(results)
    schedules = SimpleBrokerScheduleSource(runner=broker.runner)
    await broker.startup()
    try:
        await broker.kick(
            BrokerMessage(task_id=n.task_id, task_name="faults:noop", message=b"{}", labels={})
        )
        messages = broker.listen()
        message = await asyncio.wait_for(messages.__anext__(), 10)
        assert message.data == b"{}"
        await results.set_result(
            n.task_id, TaskiqResult(is_err=False, return_value=1, execution_time=0.1)
        )
        ack = message.ack()
        if ack is not None:
            await ack
        await messages.aclose()
        assert (await results.get_result(n.task_id)).return_value == 1
        await schedules.add_schedule(
            ScheduledTask(task_name="faults:noop", labels={}, args=[], kwargs={}, cron="* * * * *")
        )
        for schedule in await schedules.get_schedules():
            await schedules.pre_send(schedule)  # claims this run (schedule_claim)
            await schedules.post_send(schedule)  # confirms it was sent (schedule_sent)
            await schedules.delete_schedule(schedule.schedule_id)
    finally:
        await broker.shutdown()


def exercise_celery(url: str, namespace: str, names: Names = Names()) -> None:
    """Run every operation of the Celery transport and result backend, in this process.

    Each of the integration's scripts runs at least once (bindings,
    exchange tables, unbinding, chord parts and the chord's commit, which
    writes the body it staged); no worker process is needed.
    """
    from types import SimpleNamespace

    from celery import Celery, states
    from celery.result import AsyncResult, GroupResult
    from kombu import Connection, Exchange, Producer
    from kombu import Queue as KombuQueue

    import celery_simplebroker  # noqa: F401 - registers the "simplebroker" transport

    options = {"namespace": namespace, "lease_seconds": 5.0}
    app = Celery("exercise")
    app.conf.update(
        broker_url=f"simplebroker+{url}",
        result_backend=f"simplebroker+{url}",
        broker_transport_options=options,
        result_backend_transport_options={"namespace": namespace},
    )
    try:
        with Connection(f"simplebroker+{url}", transport_options=options) as conn:
            _celery_transport(conn, names, Exchange, Producer, KombuQueue)
        _celery_results(app, names, states, AsyncResult, GroupResult, SimpleNamespace)
    finally:
        app.close()


def _celery_transport(conn: Any, n: Names, exchange: Any, producer: Any, queue: Any) -> None:
    channel = conn.channel()
    send = producer(channel)
    for body in ("a", "b", "c"):
        send.publish(body, routing_key=n.main, serializer="json")
    first = channel.basic_get(n.main)
    first.ack()
    second = channel.basic_get(n.main)
    second.reject(requeue=True)
    again = channel.basic_get(n.main)
    again.reject(requeue=False)
    held = channel.basic_get(n.main)
    channel.basic_recover(requeue=True)
    assert held is not None
    assert channel.queue_declare(n.main, passive=True).message_count >= 1
    assert channel.queue_purge(n.main) >= 1
    fanout = exchange(n.alias, type="fanout")
    for name in (n.other, n.target):
        queue(name, fanout, expires=5.0)(channel).declare()
    send.publish({"to": "all"}, exchange=fanout, declare=[fanout], serializer="json")
    assert channel.basic_get(n.other) is not None
    channel.queue_delete(n.target)
    channel.close()


def _celery_results(
    app: Any, n: Names, states: Any, async_result: Any, group_result: Any, request: Any
) -> None:
    backend = app.backend
    task_id = n.task_id
    backend.store_result(task_id, 3, states.SUCCESS)
    assert async_result(task_id, app=app).get(timeout=10) == 3
    assert dict(backend.get_many([task_id], timeout=10))[task_id]["result"] == 3
    async_result(task_id, app=app).forget()
    # A chord of two header tasks: each part counts once, the second commits the body.
    parts = [f"{task_id}.{i}" for i in range(2)]
    group_id = f"{task_id}.group"
    group_result(group_id, [async_result(part, app=app) for part in parts]).save(backend=backend)
    body = app.signature("collect", queue=n.main)
    body.freeze()
    chord = dict(body, chord_size=len(parts))
    # Celery's set_chord_size, then add_to_chord for the second part: two in all.
    backend.set_chord_size(group_id, len(parts) - 1)
    backend.add_to_chord(group_id, async_result(parts[-1], app=app))
    for index, part in enumerate(parts):
        backend.store_result(part, index, states.SUCCESS)
        done = request(id=part, group=group_id, group_index=index, chord=chord)
        backend.on_chord_part_return(done, states.SUCCESS, index)
        backend.on_chord_part_return(done, states.SUCCESS, index)  # a second run counts once


def exercise_dramatiq(
    url: str, namespace: str, names: Names = Names(), *, scripting: str = "functions"
) -> None:
    """Run every operation of the Dramatiq broker and result backend, in this process.

    Each of the integration's scripts runs at least once: a result stored
    alone and with its acknowledgement (``dramatiq_store``), a nack and the
    expiry of dead messages (``dramatiq_dead``), with a delay, a priority
    level and a blocking result read on the way; no worker process is needed.
    """
    from dramatiq import Message

    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend

    broker = SimpleBrokerDramatiqBroker(
        url, namespace=namespace, lease_seconds=5.0, backend_options={"scripting": scripting}
    )
    backend = SimpleBrokerResultBackend(broker=broker)
    try:
        broker.declare_queue(names.main)
        for delay in (None, 1):
            message = Message(queue_name=names.main, actor_name="a", args=(), kwargs={}, options={})
            broker.enqueue(message, delay=delay)
        consumer = broker.consume(names.main, prefetch=2, timeout=2000)
        first = next(consumer)
        backend.store_result(first, "done", 60_000)  # kept for the acknowledgement
        consumer.ack(first)
        assert backend.get_result(first, block=True, timeout=5000) == "done"
        second = None
        while second is None:
            second = next(consumer)  # the delayed one, once due
        consumer.nack(second)
        backend.store_exception(second, RuntimeError("failed"), 60_000)  # after its nack: alone
        broker.store._on_beat()  # the heartbeat's expiry of dead messages
        consumer.close()
        broker.flush(names.main)
    finally:
        broker.close()
