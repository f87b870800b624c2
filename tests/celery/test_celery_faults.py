"""Workers killed, tasks outliving their lease, ETA tasks of dead workers, server restarts."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from simplebroker_redis import RedisBrokerCore, RedisRunner
from support.eventlog import read_events
from support.waiting import wait_for

# Worker-SIGKILL trials: their server side is the lease scripts, which every
# other test runs on each server binary.
pytestmark = [pytest.mark.slow, pytest.mark.once]


def done_keys(events) -> set[str]:
    return {e.words[0] for e in read_events(events) if e.kind == "done"}


@pytest.mark.parametrize("lease", [3.0])
def test_sigkill_with_acks_late_loses_nothing_and_reruns_quickly(app, start_worker, events):
    """20 SIGKILLs of a worker at random points: every task runs, re-runs come within 15 s."""
    rng = random.Random(15)
    start_worker("keeper", pool="threads", concurrency=3)  # keeps up with the re-runs
    kills: dict[int, tuple[float, int]] = {}  # trial -> (kill time, victim pid)
    results, keys = [], []
    for trial in range(20):
        victim = start_worker("victim")
        for i in range(4):
            keys.append(f"t{trial}-{i}")
            results.append(app.send_task("record", (keys[-1], 0.25)))
        time.sleep(rng.uniform(0.0, 1.0))
        victim.kill()
        kills[trial] = (time.time(), victim.pid)
    assert [r.get(timeout=90) for r in results] == keys
    log = read_events(events)
    assert set(keys) <= done_keys(events)
    died = {pid: killed_at for killed_at, pid in kills.values()}
    assert not [e for e in log if e.pid in died and e.at > died[e.pid] + 0.5]  # dead is dead
    rerun = 0
    for trial, (killed_at, pid) in kills.items():
        for i in range(4):
            key = f"t{trial}-{i}"
            starts = [e for e in log if e.kind == "start" and e.words[0] == key]
            dones = [e for e in log if e.kind == "done" and e.words[0] == key]
            if any(e.pid == pid for e in starts) and not any(e.pid == pid for e in dones):
                rerun += 1  # the victim died running it: it ran again elsewhere, soon
                assert min(e.at for e in dones) - killed_at < 15, key
    assert rerun >= 1, "no kill hit a running task; the trial proves too little"


@pytest.mark.parametrize("lease", [3.0])
def test_without_acks_late_a_started_task_is_lost_and_a_prefetched_one_comes_back(
    app, start_worker, events, celery_url, namespace
):
    """``task_acks_late = False`` (Celery's default) behaves as Celery documents.

    A task is acknowledged when it starts: if its worker dies while it runs,
    it is lost. A task the worker prefetched but had not started was not
    acknowledged: it runs elsewhere once the lease expires.
    """
    # One thread runs tasks while the consumer prefetches (window 2).
    victim = start_worker("victim", pool="threads", acks_late=False)
    running = app.send_task("record", ("running", 60.0))
    waiting = app.send_task("record", ("waiting",))

    def victim_holds_both() -> bool:
        log = [e for e in read_events(events) if e.pid == victim.pid]
        started = any(e.kind == "start" and e.words[0] == "running" for e in log)
        return started and any(e.kind == "received" and e.words[0] == waiting.id for e in log)

    wait_for(victim_holds_both, 30, "the victim to run one task and prefetch the other")
    victim.kill()
    killed = time.time()
    heir = start_worker("heir", acks_late=False)
    assert waiting.get(timeout=60) == "waiting"
    log = read_events(events)
    assert next(e for e in log if e.kind == "done" and e.words[0] == "waiting").at - killed < 15
    # "running" was acknowledged (deleted) when it started: no message is left to return.
    # ("waiting"'s acknowledgement may follow its result: the worker's loop sends it next turn.)
    runner = RedisRunner(celery_url, namespace=namespace)
    core = RedisBrokerCore(runner)
    wait_for(lambda: core.peek_many("celery", 10) == [], 10, "the queue to be empty")
    runner.shutdown()
    assert [e.pid for e in log if e.kind == "start" and e.words[0] == "running"] == [victim.pid]
    assert running.state != "SUCCESS"
    assert heir.process.poll() is None


@pytest.mark.parametrize("lease", [2.0])
def test_task_longer_than_its_lease_runs_once_while_its_worker_lives(app, start_worker, events):
    start_worker("w1")
    start_worker("w2")
    assert app.send_task("record", ("long", 7.0)).get(timeout=60) == "long"
    starts = [e for e in read_events(events) if e.kind == "start" and e.words[0] == "long"]
    assert len(starts) == 1


@pytest.mark.parametrize("lease", [4.0])
def test_eta_task_60_s_ahead_survives_the_death_of_the_worker_holding_it(app, start_worker, events):
    """Held and renewed by its worker, never redelivered; handed on with its ETA when it dies.

    The task would run a minute after it was sent; the test ends once the
    next worker holds it with the same ETA (running at an ETA is
    test_retry_with_countdown_and_eta_task's subject).
    """
    victim = start_worker("victim")
    sent = time.time()
    result = app.send_task("record", ("eta",), countdown=60)

    def received(pid: int) -> list:
        return [
            e
            for e in read_events(events)
            if e.kind == "received" and e.pid == pid and e.words[0] == result.id
        ]

    held = wait_for(lambda: received(victim.pid), 30, "the victim to hold the ETA task")
    heir = start_worker("heir")
    # The victim renews its lease: the heir does not get the task while the victim lives,
    # although two leases (8 s) pass.
    wait_for(lambda: time.time() > sent + 8, 30, "two leases", interval=0.2)
    assert not received(heir.pid)
    victim.kill()
    killed = time.time()
    handed = wait_for(lambda: received(heir.pid), 30, "the heir to hold the ETA task")
    assert handed[0].at - killed < 15
    assert handed[0].words[1] == held[0].words[1]  # the same ETA, a minute after sending
    assert time.time() < sent + 55, "the test must end before the ETA"
    assert not [e for e in read_events(events) if e.kind == "start"]


AOF = {"appendonly": True, "extra_args": ["--appendfsync", "always"]}


@pytest.fixture
def private_server(make_server):
    """A server of this test's own, which it may crash and restart (AOF: nothing is lost)."""
    return make_server("srv", **AOF)


@pytest.fixture
def celery_url(request) -> str:
    # Only the restart test asks for a private server; the others use the session's.
    if "private_server" in request.fixturenames:
        return request.getfixturevalue("private_server").url
    return request.getfixturevalue("redis_url")


@pytest.mark.parametrize("lease", [3.0])
def test_worker_carries_on_after_the_server_restarts(
    private_server, app, start_worker, events, make_server
):
    start_worker("w1")
    keys = [f"r{i}" for i in range(12)]
    results = [app.send_task("record", (key, 0.3)) for key in keys]
    wait_for(lambda: len(done_keys(events)) >= 2, 60, "the first tasks to finish")
    private_server.kill()  # a crash, in the middle of the work
    time.sleep(1.0)  # the worker notices and retries while the server is gone
    server = make_server("srv", port=private_server.port, **AOF)
    keys += [f"s{i}" for i in range(3)]
    results += [app.send_task("record", (key, 0.1)) for key in keys[12:]]
    assert [r.get(timeout=120) for r in results] == keys
    assert set(keys) <= done_keys(events)
    # Again while the worker is idle, sleeping on its wake-up channel: it reconnects.
    server.kill()
    time.sleep(2.0)
    make_server("srv", port=private_server.port, **AOF)
    assert app.send_task("record", ("idle-outage",)).get(timeout=120) == "idle-outage"


@pytest.mark.parametrize("lease", [90.0])
def test_a_killed_pool_process_requeues_its_task_at_once(app, start_worker, events):
    """Prefork + task_reject_on_worker_lost: basic_reject(requeue=True), not a lease expiry.

    The lease (90 s) outlasts the wait for the result, so only the requeue
    can bring the task back in time; the wait itself is for the result (a
    new pool process must start first, which takes seconds on a busy
    machine), never a fixed delay.
    """
    start_worker("w1", pool="prefork", concurrency=1)
    result = app.send_task("record", ("victim", 3.0))
    child = wait_for(
        lambda: next(
            (e.pid for e in read_events(events) if e.kind == "start" and e.words[0] == "victim"),
            None,
        ),
        60,
        "the pool process to start the task",
    )
    os.kill(child, signal.SIGKILL)
    assert result.get(timeout=75) == "victim"  # well before the 90 s lease could expire
    runs = [e for e in read_events(events) if e.kind == "start" and e.words[0] == "victim"]
    assert len(runs) == 2 and runs[1].pid != child


@pytest.mark.parametrize("lease", [2.0])
def test_a_task_killed_by_its_hard_time_limit_fails_once(
    app, start_worker, events, celery_url, namespace
):
    """Prefork kills the pool process at ``time_limit``: FAILURE, acknowledged, never rerun."""
    from celery.exceptions import TimeLimitExceeded

    start_worker("w1", pool="prefork", concurrency=1)
    result = app.send_task("capped", ("capped", 30.0))
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=60)
    failed = time.time()
    # Two leases later nothing brought it back: the failure was an acknowledgement.
    wait_for(lambda: time.time() > failed + 2 * 2.0 + 1.0, 30, "two leases", interval=0.2)
    runs = [e for e in read_events(events) if e.kind == "start" and e.words[0] == "capped"]
    assert len(runs) == 1
    runner = RedisRunner(celery_url, namespace=namespace)
    try:
        assert RedisBrokerCore(runner).get_queue_stat("celery").total == 0
    finally:
        runner.shutdown()


@pytest.mark.parametrize("lease", [2.0])
@pytest.mark.parametrize("pool", ["solo", "threads", "gevent", "eventlet"])
def test_a_stored_result_and_its_acknowledgement_are_one_step(
    app, start_worker, events, celery_url, namespace, pool
):
    """A worker killed after storing a result, before Celery acks, does not leave it to rerun.

    With ``acks_late`` in a solo, threads or gevent pool the result's script deletes
    the task's message too: once the result is visible, nothing of the task
    is left in the queue, so no lease expiry brings it back.
    """
    victim = start_worker("victim", pool=pool)
    result = app.send_task("die_after_result", ("once",))
    assert victim.process.wait(timeout=60) == -signal.SIGKILL
    assert result.get(timeout=10) == "once"
    runner = RedisRunner(celery_url, namespace=namespace)
    try:
        stats = RedisBrokerCore(runner).get_queue_stat("celery")
        assert stats.total == 0, stats  # not pending, not reserved: deleted with the result
    finally:
        runner.shutdown()
    # A second worker finds nothing to run again, however long the lease has expired.
    start_worker("heir")
    assert app.send_task("add", (2, 3)).get(timeout=30) == 5
    assert [e.pid for e in read_events(events) if e.kind == "run"] == [victim.pid]
