"""The broker in-process: kick, listen, ack, prefetch, hand-back, delay, cancellation."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
import redis
from simplebroker.ext import BrokerError
from taskiq import Context, TaskiqDepends
from taskiq.acks import AckableMessage
from taskiq.exceptions import TaskiqError
from taskiq.serializers import PickleSerializer
from tqhelpers import kiq, make_broker, receiving

from simplebroker_redis import AsyncMessages, AsyncRedisRunner, Leases, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from simplebroker_redis.errors import translate
from support.waiting import eventually
from taskiq_simplebroker import (
    ConfigurationError,
    DeadLetteredError,
    SimpleBrokerTaskiqBroker,
)
from taskiq_simplebroker.errors import is_transient


def pending_ids(core: RedisBrokerCore, queue: str) -> list[int]:
    return [message_id for _, message_id in core.peek_many(queue, 1000)]


async def take(listener: Any, timeout: float = 5.0) -> AckableMessage:
    message = await asyncio.wait_for(anext(listener), timeout)
    assert isinstance(message, AckableMessage)
    return message


async def test_kicked_task_is_a_simplebroker_message_shown_by_broker_peek(
    client, redis_url, namespace, tmp_path: Path
):
    task = await kiq(client, "add", 1, 2)
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    [(body, _)] = core.peek_many("taskiq", 10)
    assert body.startswith("{") and task.task_id in body
    (tmp_path / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{redis_url}"\n'
        f'[backend_options]\nnamespace = "{namespace}"\n'
    )
    cli = Path(sys.executable).with_name("broker")
    shown = subprocess.run(
        [str(cli), "peek", "taskiq"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == body


async def test_ack_consumes_exactly_that_message(client, redis_url, namespace, broker):
    worker = make_broker(redis_url, namespace)
    for i in range(3):
        await kiq(client, "add", i, i)
    before = pending_ids(broker, "taskiq")
    listener = worker.listen()
    first, second, third = [await take(listener) for _ in range(3)]
    await second.ack()
    assert pending_ids(broker, "taskiq") == [before[0], before[2]]  # reserved ones stay visible
    await first.ack()
    await third.ack()
    assert pending_ids(broker, "taskiq") == []
    await listener.aclose()
    await worker.shutdown()


async def test_any_serializer_round_trips(client, redis_url, namespace):
    client.with_serializer(PickleSerializer())
    task = await kiq(client, "add", 2, 3)
    worker = make_broker(redis_url, namespace).with_serializer(PickleSerializer())
    listener = worker.listen()
    message = await take(listener)
    assert worker.formatter.loads(message.data).task_id == task.task_id
    await message.ack()
    await listener.aclose()
    await worker.shutdown()


async def test_queue_name_label_routes_the_task(client, broker):
    await kiq(client, "add", 1, 1, queue_name="other")
    assert pending_ids(broker, "taskiq") == []
    assert len(pending_ids(broker, "other")) == 1


async def test_delay_label_hides_the_task_until_due_without_polling(
    client, redis_url, namespace, broker
):
    worker = make_broker(redis_url, namespace)
    listener = worker.listen()
    waiting = asyncio.ensure_future(take(listener, 5.0))
    await asyncio.sleep(0.2)  # the listener is asleep on an empty queue
    started = time.monotonic()
    await kiq(client, "add", 1, 2, delay=0.8)
    await asyncio.sleep(0.4)
    assert not waiting.done(), "a delayed task was delivered early"
    assert len(pending_ids(broker, "taskiq")) == 1  # visible to peek meanwhile
    message = await waiting
    assert 0.75 <= time.monotonic() - started < 2.0
    await message.ack()
    await listener.aclose()
    await worker.shutdown()


async def test_prefetch_bounds_the_read_ahead_not_the_running_tasks(
    client, redis_url, namespace, raw
):
    worker = make_broker(redis_url, namespace, prefetch=3)
    for i in range(8):
        await kiq(client, "add", i, 0)
    listener = worker.listen()
    running = [await take(listener)]
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 3  # one reservation of `prefetch`
    # Five tasks handed out and none finished: how many run at once is
    # Taskiq's limit (--max-async-tasks), not prefetch.
    running += [await take(listener) for _ in range(4)]
    # Reserved: the five running and at most `prefetch` ahead of them.
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 6
    for message in running:
        await message.ack()
    await listener.aclose()
    await worker.shutdown()
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 0

    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 0


async def test_close_hands_back_unyielded_tasks_at_once(client, redis_url, namespace, broker):
    worker = make_broker(redis_url, namespace, prefetch=5)
    for i in range(5):
        await kiq(client, "add", i, 0)
    listener = worker.listen()
    yielded = await take(listener)  # one reservation took all five
    await listener.aclose()
    # The four never yielded are claimable right away, delivery count restored.
    leases = Leases(RedisRunner(broker.runner.target, namespace=namespace))
    lease = leases.reserve("taskiq", 10, 5.0)
    assert len(lease.messages) == 4
    assert all(message.deliveries == 1 for message in lease.messages)
    leases.release(lease.token, undeliver=True)
    # The yielded one is still held; shutdown hands it back, delivered once.
    await worker.shutdown()
    lease = leases.reserve("taskiq", 10, 5.0)
    assert len(lease.messages) == 5
    assert sorted(message.deliveries for message in lease.messages) == [1, 1, 1, 1, 2]
    del yielded


async def test_cancellation_propagates_and_strands_nothing(client, redis_url, namespace, raw):
    worker = make_broker(redis_url, namespace, prefetch=4)
    for i in range(4):
        await kiq(client, "add", i, 0)
    for delay in (0, 0, 0.0005, 0.001, 0.002, 0.004):
        listener = worker.listen()
        pending = asyncio.ensure_future(anext(listener))
        await asyncio.sleep(delay)
        pending.cancel()
        try:
            message = await pending
        except asyncio.CancelledError:
            pass
        else:
            await message.ack()  # it was delivered before the cancel landed
            await kiq(client, "add", 9, 9)
        await listener.aclose()
    assert raw.hlen(f"sb:{{{namespace}}}:tokens") == 0, "a reservation was stranded"
    assert raw.zcard(f"sb:{{{namespace}}}:pending") == 4
    await worker.shutdown()


def count_round_trips(broker: SimpleBrokerTaskiqBroker) -> Callable[[], int]:
    """Count the worker's calls through its runner (each is one round trip)."""
    calls = 0
    execute = broker.runner.execute

    async def counting(operation: Callable[..., Any], **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await execute(operation, **kwargs)

    broker.runner.execute = counting  # type: ignore[method-assign]
    return lambda: calls


async def test_result_and_ack_take_one_round_trip(client, redis_url, namespace):
    worker = make_broker(redis_url, namespace)
    worker.register_task(lambda a, b: a + b, task_name="workerapp:add")
    count = 20
    round_trips = count_round_trips(worker)
    async with receiving(worker):
        await asyncio.sleep(0.3)  # startup and the first (empty) reservation
        before = round_trips()
        for i in range(count):  # one at a time: nothing to batch
            task = await kiq(client, "add", i, 1)
            result = await task.wait_result(check_interval=0.005, timeout=5)
            assert result.return_value == i + 1
        per_task = (round_trips() - before) / count
    # One reservation plus one pipeline (result + ack) per task, even one at
    # a time (nothing to batch); separate writes would make it three.
    assert per_task <= 2.1, per_task


async def test_a_backlog_costs_well_under_one_round_trip_per_task(client, redis_url, namespace):
    count = 300
    for start in range(0, count, 50):
        await asyncio.gather(*(kiq(client, "add", i, 1) for i in range(start, start + 50)))
    last = await kiq(client, "add", -1, 1)
    worker = make_broker(redis_url, namespace)
    worker.register_task(lambda a, b: a + b, task_name="workerapp:add")
    round_trips = count_round_trips(worker)
    async with receiving(worker):
        assert (await last.wait_result(check_interval=0.01, timeout=30)).return_value == 0
        per_task = round_trips() / (count + 1)
    # Reservations of up to `prefetch` tasks, and results + acknowledgements
    # of tasks finishing together sharing one pipeline.
    assert per_task <= 0.6, per_task


async def test_context_reject_dead_letters_the_task(client, redis_url, namespace, broker):
    worker = make_broker(redis_url, namespace)

    async def refuse(context: Annotated[Context, TaskiqDepends()]) -> None:
        context.reject()

    worker.register_task(refuse, task_name="workerapp:refuse")
    async with receiving(worker):
        task = await kiq(client, "refuse")
        result = await task.wait_result(check_interval=0.01, timeout=5)
    assert result.is_err
    assert pending_ids(broker, "taskiq") == []
    [(body, _)] = broker.peek_many("taskiq.dead", 10)
    assert task.task_id in body


async def test_reservation_is_renewed_while_the_event_loop_is_blocked(client, redis_url, namespace):
    worker = make_broker(redis_url, namespace, lease_seconds=0.6, heartbeat_interval=0.1)
    await kiq(client, "add", 1, 1)
    listener = worker.listen()
    message = await take(listener)
    time.sleep(1.5)  # blocks the loop: only the heartbeat thread can renew
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    assert leases.recover().released == 0
    assert leases.reserve("taskiq", 1, 1.0).messages == ()
    await message.ack()
    await listener.aclose()
    await worker.shutdown()


def test_options_are_validated(redis_url, monkeypatch):
    bad: list[dict[str, Any]] = [
        {"prefetch": 0},
        {"lease_seconds": 0},
        {"lease_seconds": 2, "heartbeat_interval": 1.5},
        {"max_deliveries": 0},
        {"queue": "q", "dead_letter_queue": "q"},
        {"recover_interval": float("nan")},
    ]
    for options in bad:
        with pytest.raises(ConfigurationError) as info:
            SimpleBrokerTaskiqBroker(redis_url, **options)
        assert isinstance(info.value, TaskiqError) and isinstance(info.value, BrokerError)
    monkeypatch.delenv("SIMPLEBROKER_REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="SIMPLEBROKER_REDIS_URL"):
        SimpleBrokerTaskiqBroker()
    monkeypatch.setenv("SIMPLEBROKER_REDIS_URL", redis_url)
    assert SimpleBrokerTaskiqBroker().runner.sync.target == redis_url


async def test_bad_delay_label_is_refused(client):
    with pytest.raises(TaskiqError):
        await kiq(client, "add", 1, 1, delay="soon")


async def test_transient_errors_are_told_apart(redis_url, namespace, raw):
    closed = AsyncRedisRunner("redis://127.0.0.1:1/0", namespace=namespace)
    with pytest.raises(BrokerError) as unreachable:
        await closed.ensure_initialized()
    assert is_transient(unreachable.value)
    assert is_transient(redis.ConnectionError("reset"))
    # An idle socket read timing out, as the runner's one error boundary raises it.
    with pytest.raises(BrokerError) as timed_out:
        try:
            raise redis.TimeoutError("Timeout reading from socket")
        except redis.TimeoutError as exc:
            raise translate(exc, "here") from exc
    assert is_transient(timed_out.value)
    runner = AsyncRedisRunner(redis_url, namespace=namespace)
    meta = f"sb:{{{namespace}}}:meta"
    raw.set(meta, "not a hash")
    try:
        # Damage is reported by the operation that meets it (opening does not inspect it).
        with pytest.raises(BrokerError) as damaged:
            await AsyncMessages(runner).write("q", "x")
    finally:
        raw.delete(meta)
    assert not is_transient(damaged.value)
    assert not is_transient(ValueError("x"))
    # A refused password does not fix itself (redis-py makes it a ConnectionError).
    assert not is_transient(redis.AuthenticationError("invalid password"))
    await runner.aclose()


def redeliver(leases: Leases, queue: str, times: int) -> None:
    """Deliver the oldest message ``times`` times without finishing it."""
    for _ in range(times):
        lease = leases.reserve(queue, 1, 30.0)
        assert len(lease.messages) == 1
        leases.release(lease.token)


async def test_last_delivery_runs_alone_and_hands_back_its_batch(client, redis_url, namespace, raw):
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    await kiq(client, "add", 0, 0)  # the oldest: delivered twice already
    redeliver(leases, "taskiq", 2)
    for i in range(3):
        await kiq(client, "add", i, 1)
    worker = make_broker(redis_url, namespace, prefetch=10, max_deliveries=3)
    listener = worker.listen()
    last = await take(listener)
    assert worker.formatter.loads(last.data).args == [0, 0]
    blocked = asyncio.ensure_future(take(listener, 5.0))
    await asyncio.sleep(0.3)
    assert not blocked.done(), "something was delivered alongside a last delivery"
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 1
    assert [leases.deliveries(i) for _, i in broker_ids(redis_url, namespace)[1:]] == [0, 0, 0]
    await last.ack()
    rest = [await blocked, await take(listener), await take(listener)]
    assert sorted(worker.formatter.loads(m.data).args[0] for m in rest) == [0, 1, 2]
    for message in rest:
        await message.ack()
    await listener.aclose()
    await worker.shutdown()


async def test_last_delivery_waits_until_the_listener_is_idle(client, redis_url, namespace, raw):
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    await kiq(client, "add", 9, 9)
    redeliver(leases, "taskiq", 1)
    leases.reserve("taskiq", 1, 0.5)  # a second delivery to a worker that dies
    await kiq(client, "add", 1, 1)
    worker = make_broker(redis_url, namespace, prefetch=5, max_deliveries=3, heartbeat_interval=0.1)
    listener = worker.listen()
    first = await take(listener)
    assert worker.formatter.loads(first.data).args == [1, 1]
    # The dead worker's lease expires; our heartbeat recovers the message and
    # the listener reserves it for its last delivery, but holds it back.
    waiting = asyncio.ensure_future(take(listener, 5.0))
    await eventually(lambda: raw.zcard(f"sb:{{{namespace}}}:reserved") == 2, timeout=5)
    await asyncio.sleep(0.3)
    assert not waiting.done(), "a last delivery ran next to another task"
    await first.ack()
    last = await waiting
    assert worker.formatter.loads(last.data).args == [9, 9]
    assert leases.deliveries(int(last_id(redis_url, namespace))) == 3
    await last.ack()
    await listener.aclose()
    await worker.shutdown()


async def test_a_last_delivery_stopped_at_shutdown_gets_a_dead_letter_result(
    client, redis_url, namespace, broker
):
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    task = await kiq(client, "add", 1, 1)
    redeliver(leases, "taskiq", 1)  # a worker died running it once
    worker = make_broker(redis_url, namespace, max_deliveries=2)
    listener = worker.listen()
    await take(listener)  # its last allowed delivery...
    await listener.aclose()
    await worker.shutdown()  # ... unfinished when the worker stops: dead-lettered
    [(body, _)] = broker.peek_many("taskiq.dead", 10)
    assert task.task_id in body
    result = await task.wait_result(check_interval=0.02, timeout=5)
    assert result.is_err and isinstance(result.error, DeadLetteredError)
    assert "after 2 deliveries" in str(result.error)


async def test_an_unreplicated_reservation_is_handed_back_uncounted(
    client, redis_url, namespace, raw, caplog
):
    """``wait_replicas`` unmet: each reservation raises ``ReplicationTimeout`` after it happened.

    Its tasks go back at once, their delivery not counted; stranded until
    their lease expired they would count one each time, and with
    ``max_deliveries=1`` go to the dead-letter queue without ever running.
    """
    await kiq(client, "add", 1, 1)
    [(_, task_id)] = broker_ids(redis_url, namespace)
    worker = make_broker(redis_url, namespace, max_deliveries=1, wait_replicas=5, wait_timeout=0.05)
    listener = worker.listen()
    taking = asyncio.ensure_future(take(listener, 30.0))
    await eventually(lambda: "replicas acknowledged it" in caplog.text, timeout=10)
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking
    await listener.aclose()
    await worker.shutdown()
    runner = RedisRunner(redis_url, namespace=namespace)
    assert Leases(runner).deliveries(task_id) == 0
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 0
    assert [i for _, i in broker_ids(redis_url, namespace)] == [task_id]  # pending, not dead
    assert raw.xlen(runner.keys.dead_letters) == 0
    runner.shutdown()


def broker_ids(redis_url: str, namespace: str) -> list[tuple[str, int]]:
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    return core.peek_many("taskiq", 100)


def last_id(redis_url: str, namespace: str) -> int:
    return broker_ids(redis_url, namespace)[0][1]


def top_level_calls(raw) -> dict[str, int]:
    stats = raw.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "ping")}


async def test_an_idle_listener_sends_almost_nothing(tmp_path):
    # A private server: the session server also carries other tests' clients.
    with DevServer(data_dir=str(tmp_path / "quiet")) as server:
        raw = redis.Redis.from_url(server.url, decode_responses=True)
        client = make_broker(server.url, "idle")
        await client.startup()
        worker = make_broker(server.url, "idle", lease_seconds=4.0, heartbeat_interval=1.0)
        listener = worker.listen()
        waiting = asyncio.ensure_future(take(listener, 10.0))
        await asyncio.sleep(0.5)  # subscribed, one empty reservation, asleep
        before = top_level_calls(raw)
        await asyncio.sleep(2.0)
        after = top_level_calls(raw)
        # No polling: only the heartbeat's recovery pass (one script per second).
        assert after["ping"] - before["ping"] == 0
        assert after["evalsha"] - before["evalsha"] <= 3
        await kiq(client, "add", 1, 1)  # and a wake-up still arrives at once
        message = await asyncio.wait_for(waiting, 2.0)
        await message.ack()
        await listener.aclose()
        await worker.shutdown()
        await client.shutdown()
        raw.close()
