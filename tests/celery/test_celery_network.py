"""Celery workers and producers through network faults (issue 42), on a fault proxy.

Workers reach the server through :class:`~support.faultproxy.FaultProxy`
(``celery_url`` is its URL); the test's own producer and result reads go
to the server directly unless a test says otherwise. Workers run the
prefork pool with two processes, as the issue's runs did, and Celery's
default ``result_backend_always_retry = False``: what is tested is this
package's own handling, not Celery's retry loop.
"""

from __future__ import annotations

import gc
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simplebroker_redis.devserver import DevServer
from support.eventlog import read_events
from support.faultproxy import FaultProxy
from support.processes import Process
from support.waiting import wait_for

# Network-fault trials of workers: their scripts (fenced results, idempotent
# publishes) run on each server binary in tests/celery/test_celery_results.py
# and tests/test_write_once.py.
pytestmark = pytest.mark.once

#: Seconds an outage lasts at least (the lease is longer: nothing expires).
OUTAGE = 3.0

#: Celery settings of the workers: Celery's defaults where the test app changes them.
DEFAULTS = json.dumps({"result_backend_always_retry": False})


@pytest.fixture
def proxy(server: DevServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", server.port)) as faults:
        yield faults


@pytest.fixture
def celery_url(proxy: FaultProxy) -> str:
    return proxy.url()


@pytest.fixture
def direct(server: DevServer, namespace: str, events: Path, lease: float) -> Iterator[Any]:
    """A producer and result reader that reaches the server without the proxy."""
    from celeryapp import make_app

    application = make_app(server.url, namespace, str(events), lease)
    application.conf.result_backend_always_retry = False
    yield application
    application.close()


def prefork(start_worker: Any, name: str) -> Process:
    """Start a prefork worker with two processes (the issue's), Celery's result defaults."""
    worker: Process = start_worker(
        name, pool="prefork", concurrency=2, env={"CELERY_CONF": DEFAULTS}
    )
    return worker


def finished(events: Path) -> set[str]:
    return {event.words[0] for event in read_events(events, "done")}


def starts(events: Path) -> Counter[str]:
    return Counter(event.words[0] for event in read_events(events, "start"))


def logged(worker: Process, text: str) -> bool:
    return text in worker.output()


def outage(seconds: float) -> None:
    """Let a fault last ``seconds`` (its length is the scenario's, not a wait for readiness)."""
    time.sleep(seconds)


@pytest.mark.parametrize("lease", [6.0])
def test_a_worker_resumes_at_once_after_every_connection_is_reset_and_refused(
    proxy, direct, events, start_worker
):
    """The issue's hang: every connection reset, new ones refused, mid-run; then healed.

    Tasks finished during the outage have their acknowledgement deferred and
    their result's store retried (neither raises to Celery), the consumer
    never restarts, and the worker takes tasks again within 2 s of the heal.
    Every result is the task's own: SUCCESS, none lost.
    """
    worker = prefork(start_worker, "w")
    keys = [f"k{i}" for i in range(40)]
    results = [direct.send_task("record", (key, 0.2)) for key in keys]
    wait_for(lambda: len(finished(events)) >= 8, 30, "the worker to be busy")
    proxy.reset(refuse=True)
    outage(OUTAGE)
    healed = time.time()
    proxy.heal()
    assert [result.get(timeout=60) for result in results] == keys
    resumed = min(event.at for event in read_events(events, "start") if event.at > healed)
    assert resumed - healed < 2.0, f"took {resumed - healed:.1f} s to resume"
    assert logged(worker, "storing the SUCCESS")  # a task finished in the outage: retried
    assert not logged(worker, "Connection to broker lost")  # Celery's consumer never restarted
    assert not logged(worker, "outside body")
    assert not logged(worker, "Couldn't ack")


def queue_total(server: DevServer, namespace: str, queue: str = "celery") -> int:
    """Return how many messages ``queue`` stores (pending or reserved), read directly."""
    from simplebroker_redis import RedisBrokerCore, RedisRunner

    runner = RedisRunner(server.url, namespace=namespace)
    try:
        return int(RedisBrokerCore(runner).get_queue_stat(queue).total)
    finally:
        runner.shutdown()


def settled(proxy: FaultProxy, server: DevServer, baseline: int) -> bool:
    """Return True once every request the proxy held was delivered and the server closed it."""
    return proxy.connections == 0 and connected_clients(server) <= baseline


def producer(proxy: FaultProxy, namespace: str, events: Path, retries: int) -> Any:
    """A producer through the proxy whose commands time out after 1 s (URL option)."""
    from celeryapp import make_app

    app = make_app(f"{proxy.url()}?socket_timeout=1", namespace, str(events))
    # No task statistics: their sender's connection would stay open through the proxy.
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "task_stats": False}
    app.conf.task_publish_retry_policy = {
        "max_retries": retries,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.2,
    }
    return app


def close(app: Any) -> None:
    """Close every connection of a producer app (its held requests then reach the server)."""
    app.amqp.producer_pool.force_close_all()  # Celery's close() only forgets its pools
    app.pool.force_close_all()
    app.close()
    app.backend.runner.shutdown()
    gc.collect()  # kombu drops the transports of a retried publish without closing them


def connected_clients(server: DevServer) -> int:
    import redis

    client = redis.Redis(port=server.port)
    try:
        return int(client.info("clients")["connected_clients"]) - 1  # not this one
    finally:
        client.close()


def test_a_publish_cut_off_fails_in_bounded_time_saying_its_outcome_is_unknown(
    proxy, server, namespace, events
):
    """``delay()`` in a blackhole raises after its tries time out, and says what is known.

    Each try's write reached the proxy, which held it: the outcome is
    unknown, not "cannot reach". Delivered at the heal, the three tries
    store the task once (the publish is idempotent).
    """
    app = producer(proxy, namespace, events, retries=2)
    app.send_task("record", ("warm",)).forget()  # connected, the namespace checked
    baseline = connected_clients(server)
    proxy.blackhole()
    began = time.monotonic()
    with pytest.raises(Exception) as raised:
        app.send_task("record", ("cut",))
    took = time.monotonic() - began
    proxy.heal()
    assert "outcome of this publish is unknown" in str(raised.value), raised.value
    # Three tries of at most a 1 s read each (and a reconnect each): bounded, not a hang.
    assert took < 3 * 2 * 1.0 + 3.0, f"took {took:.1f} s"
    close(app)
    wait_for(lambda: settled(proxy, server, baseline), 30, "the held requests to be delivered")
    assert queue_total(server, namespace) == 2  # "warm" and one copy of "cut"


def test_a_publish_with_the_default_settings_fails_within_its_bound_in_a_blackhole(
    proxy, server, namespace, events
):
    """``delay()`` with no timeout configured: it fails within 10 s, not at the heal.

    The transport's ``publish_timeout`` (5 s) bounds each try and starts
    no try after it; Celery's own retry policy (3 retries) is left as it
    is. The held write is delivered at the heal: one copy.
    """
    from celeryapp import make_app

    app = make_app(proxy.url(), namespace, str(events))
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "task_stats": False}
    app.send_task("record", ("warm",)).forget()
    baseline = connected_clients(server)
    proxy.blackhole()
    began = time.monotonic()
    try:
        with pytest.raises(Exception) as raised:
            app.send_task("record", ("cut",))
        took = time.monotonic() - began
        # A later send in the same outage starts on a new connection with
        # kombu's queue declaration: bounded the same (it took 11 s).
        again = time.monotonic()
        with pytest.raises(Exception) as later:
            app.send_task("record", ("later",))
        later_took = time.monotonic() - again
    finally:
        proxy.heal()
    assert "outcome of this publish" in str(raised.value), raised.value
    assert "unknown" in str(raised.value)
    assert took <= 10.0, f"took {took:.1f} s"
    assert later_took <= 10.0, f"the later send took {later_took:.1f} s: {later.value}"
    assert "cannot reach Redis" in str(later.value) or "outcome" in str(later.value), later.value
    close(app)
    wait_for(lambda: settled(proxy, server, baseline), 30, "the held requests to be delivered")
    # "warm", one copy of "cut", and of "later" only if a try of it was sent.
    sent_later = "outcome" in str(later.value)
    assert queue_total(server, namespace) == 2 + sent_later, later.value


def test_a_publish_that_returned_success_stored_its_task_exactly_once(
    proxy, server, namespace, events
):
    """A blackhole shorter than the publish's retries: success, and one copy, not two.

    The first try's write is held and delivered at the heal; the retry that
    succeeds sends the same write again: the idempotency key keeps one.
    """
    app = producer(proxy, namespace, events, retries=20)
    app.send_task("record", ("warm",)).forget()
    baseline = connected_clients(server)
    proxy.blackhole()
    healer = __import__("threading").Timer(2.5, proxy.heal)
    healer.start()
    try:
        app.send_task("record", ("once",))  # returns only after the heal: success
    finally:
        healer.join()
    close(app)
    wait_for(lambda: settled(proxy, server, baseline), 30, "the held requests to be delivered")
    assert queue_total(server, namespace) == 2  # "warm" and "once", once


@pytest.mark.parametrize("lease", [2.0])
def test_a_worker_stopped_past_its_lease_neither_overwrites_results_nor_starts_stale_tasks(
    direct, events, start_worker
):
    """One of two workers is SIGSTOPped for 3x the lease, then resumed (issue 42).

    The live worker takes its tasks over. The resumed one finishes the
    tasks it was running, but their late results are refused (fenced): the
    stored result of every task it lost is the live worker's. The tasks it
    had prefetched but not started are not started after their leases ran
    out: Celery's consumer restarts and its pool drops them.
    """
    stale = prefork(start_worker, "stale")
    live = prefork(start_worker, "live")
    keys = [f"s{i}" for i in range(40)]
    results = [direct.send_task("whoami", (key, 0.5)) for key in keys]
    key_of = {result.id: key for result, key in zip(results, keys, strict=True)}

    def stale_is_busy() -> bool:
        ran = [e for e in read_events(events, "start") if e.words[1].startswith("stale@")]
        got = [e for e in read_events(events, "received") if e.pid == stale.pid]
        return len(ran) >= 2 and len(got) >= 4

    wait_for(stale_is_busy, 30, "the stale worker to run and prefetch tasks")
    stale.signal(signal.SIGSTOP)
    stopped = time.time()
    outage(3 * 2.0)
    stale.signal(signal.SIGCONT)
    resumed = time.time()
    stored = [result.get(timeout=60).split() for result in results]
    assert [row[0] for row in stored] == keys
    log = read_events(events)
    done_by = {
        key: {e.words[1].split("@")[0] for e in log if e.kind == "done" and e.words[0] == key}
        for key in keys
    }
    late = {
        e.words[0]
        for e in log
        if e.kind == "done" and e.words[1].startswith("stale@") and e.at > resumed
    }
    assert late, "the stale worker finished no task after it resumed; the test proves too little"
    for key, (_, hostname, _) in zip(keys, stored, strict=True):
        if key in late and "live" in done_by[key]:
            assert hostname.startswith("live@"), f"{key}: the stale worker's late result was stored"

    def received_by_stale(before: float, after: float) -> set[str]:
        return {
            key_of[e.words[0]]
            for e in log
            if e.kind == "received" and e.pid == stale.pid and after < e.at < before
        }

    prefetched = received_by_stale(stopped, 0.0)
    delivered_again = received_by_stale(float("inf"), resumed)  # a new lease: may run
    started_late = {
        e.words[0]
        for e in log
        if e.kind == "start" and e.words[1].startswith("stale@") and e.at > resumed
    }
    assert not (started_late & prefetched) - delivered_again, "started after its lease ran out"
    assert "taken over by another worker" in stale.output()  # the consumer restarted
    assert live.alive() and stale.alive()


def test_a_pool_process_does_not_start_a_task_whose_lease_was_taken_over(server, namespace, events):
    """The check a pool process makes right before a task's body (``.prestart``, issue 42).

    Celery's own tracer of the test app's task, wrapped as every pool
    process wraps it, given the request a delivered message carries: its
    known deadline passed. While the reservation is still the worker's
    (renewed meanwhile) the task runs; once another worker's recovery took
    it over, the task is rejected with requeue and its body never runs.
    """
    from celery.app.trace import build_tracer
    from celeryapp import make_app

    from celery_simplebroker.fencing import HOLDER_FIELD, holder_mark
    from celery_simplebroker.prestart import LEASE_UNTIL_FIELD, guard
    from simplebroker_redis import Leases, RedisBrokerCore, RedisRunner

    app = make_app(server.url, namespace, str(events), 0.5)
    runner = RedisRunner(server.url, namespace=namespace)
    try:
        task = app.tasks["record"]
        traced = guard(app, build_tracer(task.name, task, app=app))
        leases = Leases(runner)
        for key in ("held", "taken"):
            RedisBrokerCore(runner).write("celery", key)
        kept, lost = (leases.reserve("celery", 1, 0.5) for _ in range(2))

        def request(lease: Any, key: str) -> dict[str, Any]:
            tag = f"{lease.token}:{lease.messages[0].id}"
            properties = {
                "delivery_tag": tag,
                HOLDER_FIELD: holder_mark(runner.identity),
                LEASE_UNTIL_FIELD: time.monotonic() - 1.0,  # its known deadline passed
            }
            return {"id": key, "task": "record", "properties": properties, "delivery_info": {}}

        def taken_over() -> bool:
            leases.renew([kept.token])  # the worker renews what it still holds
            return leases.recover().released >= 1

        wait_for(taken_over, 10, "the other reservation to run out and be recovered")
        ran = traced("held", ("held",), {}, request(kept, "held"))
        refused = traced("taken", ("taken",), {}, request(lost, "taken"))
        assert ran.retval == "held"
        assert refused.info is not None and refused.info.state == "REJECTED"
        reject = refused.retval.exception  # as the pool sends it back to the event loop
        assert getattr(reject, "exc", reject).requeue  # Celery then hands the message back
        assert set(starts(events)) == {"held"}  # the taken-over task's body never ran
    finally:
        app.close()
        runner.shutdown()


@pytest.mark.parametrize("lease", [1.0])
def test_a_task_that_waited_past_its_known_deadline_starts_while_still_held(
    events, direct, start_worker
):
    """A prefork worker checks, in its pool process, a task that waited longer than the lease.

    The second task waits for the only pool process while the first runs
    three leases long: its deadline as known at delivery passed, the pool
    process asks the server, which still has it under this worker's lease
    (renewed meanwhile): it starts, once, and nothing is refused.
    """
    worker = start_worker("busy", pool="prefork", env={"CELERY_CONF": DEFAULTS})
    first = direct.send_task("record", ("first", 3.0))
    second = direct.send_task("record", ("second", 0.0))
    assert first.get(timeout=60) == "first" and second.get(timeout=60) == "second"
    begun = {e.words[0]: e.at for e in read_events(events, "start")}
    assert begun["second"] - begun["first"] > 2.0  # it waited past its known deadline
    assert starts(events) == Counter({"first": 1, "second": 1})
    assert "is not started" not in worker.output()


@pytest.mark.parametrize("lease", [2.0])
def test_a_worker_keeps_its_leases_with_0_3_s_added_to_every_packet(
    proxy, server, namespace, events, direct, start_worker
):
    """0.3 s more each way on every packet, for three leases: no lease runs out (issue 42).

    The worker's renewal has a connection and a thread of its own, so it
    never waits behind the heartbeat's other round trips (the worker's
    record, the bindings' refresh, recovery passes) or the event loop's.
    Another worker's recovery (the test's, on a direct connection) finds
    nothing of it to take, and every task runs once.
    """
    from simplebroker_redis import Leases, RedisRunner

    worker = prefork(start_worker, "slow")
    keys = [f"l{i}" for i in range(16)]
    results = [direct.send_task("record", (key, 0.3)) for key in keys]
    wait_for(lambda: len(starts(events)) >= 2, 30, "the worker to be busy")
    runner = RedisRunner(server.url, namespace=namespace)
    released = 0
    try:
        leases = Leases(runner)
        proxy.latency(0.3)
        end = time.monotonic() + 3 * 2.0
        while time.monotonic() < end:  # a recovery pass every 0.2 s, as a worker's
            released += leases.recover().released
            time.sleep(0.2)
    finally:
        proxy.heal()
        runner.shutdown()
    assert [result.get(timeout=60) for result in results] == keys
    assert released == 0, "a lease of the slowed worker ran out and was recovered"
    assert starts(events) == Counter(dict.fromkeys(keys, 1))
    assert "could renew them" not in worker.output()


@pytest.mark.parametrize("lease", [2.0])
def test_a_blackhole_longer_than_the_lease_leaves_no_worker_silent(
    proxy, direct, events, start_worker
):
    """Nothing moves for 4.5x the lease, no connection closed (issue 42, item 5).

    The wake-up subscription notices its silent connection (a PING left
    unanswered) and reconnects; commands time out instead of waiting for the
    network. At the heal the worker renews its leases (nobody took them
    over), finishes what it held and takes new tasks at once.
    """
    worker = prefork(start_worker, "w")
    keys = [f"b{i}" for i in range(24)]
    results = [direct.send_task("record", (key, 0.2)) for key in keys[:16]]
    wait_for(lambda: len(finished(events)) >= 4, 30, "the worker to be busy")
    proxy.blackhole()
    outage(9.0)  # longer than a subscription's PING check (5 s + 3 s) and the lease
    healed = time.time()
    proxy.heal()
    results += [direct.send_task("record", (key, 0.2)) for key in keys[16:]]
    assert [result.get(timeout=60) for result in results] == keys
    resumed = min(event.at for event in read_events(events, "start") if event.at > healed)
    assert resumed - healed < 2.0, f"took {resumed - healed:.1f} s to resume"
    assert logged(worker, "half-open")  # the subscription gave its silent connection up
    assert not logged(worker, "outside body")
    twice = [key for key, count in starts(events).items() if count > 1]
    assert not twice, f"ran twice though no other worker could take them: {twice}"


@pytest.mark.parametrize("lease", [6.0])
def test_an_acknowledgement_the_outage_held_up_is_sent_once_the_server_answers(
    proxy, direct, events, start_worker, server, namespace
):
    """A task without a result ends in an outage: its acknowledgement is deferred, then sent.

    Celery acknowledges once; the slot is freed at once and the heartbeat
    sends the acknowledgement after the heal: the task ran once and its
    message is gone, and the worker goes on taking tasks.
    """
    worker = prefork(start_worker, "w")
    long = direct.send_task("record", ("long", 1.5), ignore_result=True)
    wait_for(lambda: "long" in starts(events), 30, "the task to start")
    proxy.reset(refuse=True)
    wait_for(lambda: "long" in finished(events), 30, "the task to end in the outage")
    outage(2.0)  # the worker's acknowledgement meets refused connections
    proxy.heal()
    wait_for(lambda: logged(worker, "deferred acknowledgement"), 30, "the deferred one to be sent")
    assert direct.send_task("record", ("next",)).get(timeout=30) == "next"
    wait_for(lambda: queue_total(server, namespace) == 0, 30, "the queue to be empty")
    assert starts(events)["long"] == 1
    assert long.state == "PENDING"  # no result was to be stored
    assert not logged(worker, "Couldn't ack")


@pytest.mark.parametrize("lease", [2.0])
def test_a_result_the_server_cannot_take_within_the_lease_sends_its_task_back(
    proxy, direct, events, start_worker
):
    """The server refuses connections for longer than the lease while tasks finish.

    Their results' stores are retried for the lease, then their messages
    are handed back: they run again and store their own result. None is
    recorded FAILURE ("Exception raised outside body"), none is lost.
    """
    worker = prefork(start_worker, "w")
    keys = [f"r{i}" for i in range(6)]
    results = [direct.send_task("record", (key, 1.0)) for key in keys]
    wait_for(lambda: len(starts(events)) >= 2, 30, "tasks to run")
    proxy.reset(refuse=True)
    wait_for(lambda: logged(worker, "goes back to the queue"), 30, "a store to give up")
    proxy.heal()
    assert [result.get(timeout=60) for result in results] == keys
    assert all(result.state == "SUCCESS" for result in results)
    assert not logged(worker, "outside body")
    assert any(count > 1 for count in starts(events).values())  # handed back, ran again
