"""Network faults and stalls under real ``taskiq worker`` processes (issue 42).

Workers reach the server through the suite's fault proxy
(``support/faultproxy.py``) where the fault is the network's:

- a partition longer than the lease: the worker must not recover its own
  reservations and run its prefetched tasks twice;
- a worker stopped (SIGSTOP) for three leases: it must not start the
  prefetched tasks whose leases ran out meanwhile, and its late results
  must not overwrite those of the worker that took its tasks over;
- a producer whose replies are cut off: ``kiq()`` fails within its bound
  with an error that says the task may be queued, and sending it again
  never stores it twice;
- an idle worker behind a silent network: its subscription notices the
  half-open connection, and it takes new work within seconds of the heal;
- a token taken over after one of its tasks was acknowledged: the
  acknowledged one no longer counts as being settled, so the loss is
  reported and the prefetched one is not started under the lost lease.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import pytest
from taskiq.exceptions import SendTaskError
from taskiq.kicker import AsyncKicker
from tqhelpers import events, kiq

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy
from support.waiting import eventually
from taskiq_simplebroker import SimpleBrokerTaskiqBroker
from taskiq_simplebroker.errors import TaskOutcomeUnknown

# Network-fault trials of workers: their scripts (fenced commits, idempotent
# writes, spared recoveries) run on each server binary in tests/test_write_once.py
# and tests/test_holdings.py.
pytestmark = pytest.mark.once


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def _in_flight(task_log, worker: str) -> set[str]:
    started = {e.key for e in events(task_log, "start") if e.worker == worker}
    return started - {e.key for e in events(task_log, "done") if e.worker == worker}


async def test_a_partition_longer_than_the_lease_runs_no_task_twice(
    start_worker, client, task_log, proxy
):
    worker = start_worker(
        "--max-async-tasks",
        "2",
        env={
            "SIMPLEBROKER_REDIS_URL": proxy.url() + "?socket_timeout=1",
            "TQ_LEASE": "2",
            "TQ_HEARTBEAT": "0.4",
            "TQ_PREFETCH": "8",
        },
    )
    tasks = [await kiq(client, "record", f"k{i}", 0.3) for i in range(30)]
    await eventually(lambda: len(events(task_log, "done")) >= 3, timeout=60, interval=0.02)
    proxy.blackhole()
    await asyncio.sleep(5.0)  # the fault: 2.5 leases without a byte either way
    proxy.heal()
    for task in tasks:
        assert not (await task.wait_result(check_interval=0.05, timeout=60)).is_err
    starts = Counter(e.key for e in events(task_log, "start"))
    assert set(starts) == {f"k{i}" for i in range(30)}
    assert [key for key, n in starts.items() if n > 1] == []
    output = worker.output()
    assert "could renew them" not in output  # no other worker: nothing was taken over
    assert "another worker recovered" not in output


async def test_a_worker_stopped_past_its_lease_starts_nothing_stale_and_is_fenced(
    start_worker, client, task_log, raw, namespace
):
    fast = {"TQ_LEASE": "1.0", "TQ_HEARTBEAT": "0.2", "TQ_PREFETCH": "6"}
    stopped = start_worker("--max-async-tasks", "2", env={**fast, "TQ_NAME": "stopped"})
    start_worker("--max-async-tasks", "2", env={**fast, "TQ_NAME": "live"})
    # Few enough that the live worker is idle when it recovers the stopped
    # one's tasks: it reruns them before the stopped one wakes, whose late
    # results would then overwrite the live ones without the fence.
    keys = [f"k{i}" for i in range(14)]
    tasks = {key: await kiq(client, "witness", key, 0.4) for key in keys}
    await eventually(lambda: _in_flight(task_log, "stopped"), timeout=60, interval=0.01)
    stopped.signal(signal.SIGSTOP)
    in_flight = _in_flight(task_log, "stopped")
    await asyncio.sleep(3.0)  # the fault: three leases frozen
    resumed = time.time()
    stopped.signal(signal.SIGCONT)
    for task in tasks.values():
        await task.wait_result(check_interval=0.05, timeout=60)
    # Every late commit of the stopped worker sent (a graceful stop drains
    # them), every acknowledgement landed: then read what is stored (a
    # result read earlier may be one a later, legitimate run replaced).
    assert await asyncio.to_thread(stopped.stop) == 0
    reserved = f"sb:{{{namespace}}}:reserved"
    await eventually(lambda: raw.zcard(reserved) == 0, timeout=30, interval=0.05)
    results = {
        key: (await client.result_backend.get_result(task.task_id)).return_value
        for key, task in tasks.items()
    }
    starts = events(task_log, "start")
    assert {e.key for e in events(task_log, "done")} == set(keys), "a task was lost"
    twice = {key for key, n in Counter(e.key for e in starts).items() if n > 1}
    # Only what was running when it stopped ran twice: nothing it had
    # prefetched started after it woke with its leases run out.
    assert twice <= in_flight, (twice, in_flight)
    late = {e.key for e in starts if e.worker == "stopped" and e.at >= resumed}
    assert not late & {e.key for e in starts if e.worker == "live"}
    # The stored result of a task both ran is the live worker's, not the late one's.
    live_pids = {e.pid for e in starts if e.worker == "live"}
    for key in twice:
        assert int(results[key][1]) in live_pids, (key, results[key])


async def test_kiq_with_its_replies_cut_off_fails_in_bounds_and_a_resend_is_stored_once(
    proxy, redis_url, namespace
):
    producer = SimpleBrokerTaskiqBroker(proxy.url() + "?socket_timeout=1", namespace=namespace)
    await producer.startup()
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    try:
        kicker: AsyncKicker = AsyncKicker("workerapp:add", producer, {})
        await kicker.kiq(0, 0)  # connected and warm
        proxy.blackhole("to_client")  # requests reach the server, replies do not
        started = time.monotonic()
        with pytest.raises(SendTaskError) as raised:
            await kicker.with_task_id("resent-task").kiq(1, 2)
        assert time.monotonic() - started < 6
        cause = raised.value.__cause__
        assert isinstance(cause, TaskOutcomeUnknown) and cause.task_id == "resent-task"
        assert "may or may not have been queued" in str(cause)
        proxy.heal()
        await kicker.with_task_id("resent-task").kiq(1, 2)
        bodies = [body for body, _ in core.peek_many("taskiq", 10)]
        assert sum("resent-task" in body for body in bodies) == 1
    finally:
        proxy.heal()
        await producer.shutdown()


async def test_an_idle_worker_notices_a_silent_network_and_resumes_soon_after_the_heal(
    start_worker, client, task_log, proxy
):
    worker = start_worker(env={"SIMPLEBROKER_REDIS_URL": proxy.url()})
    first = await kiq(client, "record", "before", 0.0)
    await first.wait_result(check_interval=0.02, timeout=60)
    before = proxy.accepted
    proxy.blackhole()
    # Its wake-up subscription notices within a PING interval and timeout
    # (5 + 3 s) and reconnects, without waiting for TCP to give up.
    await eventually(
        lambda: "wake-up subscription" in worker.output() and "PING" in worker.output(),
        timeout=20,
        interval=0.1,
    )
    await eventually(lambda: proxy.accepted > before, timeout=10, interval=0.05)  # reconnected
    proxy.heal()
    healed = time.monotonic()
    after = await kiq(client, "record", "after", 0.0)
    await after.wait_result(check_interval=0.02, timeout=30)
    took = time.monotonic() - healed
    assert took < 4.0, f"resumed {took:.1f} s after the heal"


async def test_a_prefetched_task_of_a_token_taken_over_after_a_sibling_was_acked_is_lost(
    client, redis_url, namespace, caplog
):
    """A token's settled message stops counting as settling; the rest is lost when taken over.

    Two tasks reserved under one token; the first is acknowledged, then
    the token is taken over (released on the server, as another worker's
    recovery of an expired lease would). The heartbeat reports it lost
    (it held the second, not being settled), and the listener does not
    start the second under the lost lease: it comes back under a new one.
    """
    from taskiq.acks import AckableMessage
    from tqhelpers import make_broker

    from simplebroker_redis import Leases

    worker = make_broker(redis_url, namespace, prefetch=2)
    for i in range(2):
        await kiq(client, "add", i, i)
    listener = worker.listen()
    first = await asyncio.wait_for(anext(listener), 10)
    assert isinstance(first, AckableMessage)
    runtime = worker._runtimes[0]
    [token] = runtime.holdings.tokens()
    heartbeat = runtime.heartbeat
    heartbeat.stop()  # this test renews at the moment it means to
    await first.ack()
    assert runtime.holdings.holds(token)  # the second, prefetched
    leases = Leases(runtime.runner.sync)
    leases.release(token)
    with caplog.at_level("WARNING", logger="taskiq_simplebroker"):
        heartbeat._renew(leases)
        second = await asyncio.wait_for(anext(listener), 10)
    assert "ran out before this process could renew" in caplog.text
    assert "another worker recovered them" in caplog.text
    assert token not in runtime.holdings.tokens()  # delivered again under a lease of its own
    await second.ack()
    await listener.aclose()
    await worker.shutdown()
