"""Real ``dramatiq`` worker processes on the broker: results, SIGKILLs, long and CPU-bound tasks.

The workers run ``dqapp`` with a short lease (2 s, renewed every 0.5 s), so
a killed worker's messages come back within seconds. The kill trial's
length is ``DQ_KILLS`` (3 in ``make test``; ``make dramatiq-kill-trial``
runs 20 with the default 10 s lease and prints the redelivery times).
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from dqhelpers import events, group_pids, keys_of, sender_actors, start_worker
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerResultBackend
from support.waiting import wait_for

# Worker processes and their SIGKILL trials: their server side is the lease
# scripts, which every other test runs on each server binary.
pytestmark = pytest.mark.once

KILLS = int(os.environ.get("DQ_KILLS", "3"))
KILL_LEASE = float(os.environ.get("DQ_KILL_LEASE", "2"))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "events.log"


def test_processes_and_threads_run_every_task_with_its_result(
    redis_url, namespace, log, children, dq_broker
):
    worker = start_worker(children, redis_url, namespace, log, processes=2, threads=2)
    backend = SimpleBrokerResultBackend(broker=dq_broker)
    dq_broker.add_middleware(Results(backend=backend))
    work, _ = sender_actors(dq_broker)
    messages = [work.send(f"k{i}") for i in range(40)]
    results = [
        message.get_result(backend=backend, block=True, timeout=60_000) for message in messages
    ]
    assert results == [f"k{i}" for i in range(40)]
    done = keys_of(log, "done")
    assert set(done) == {f"k{i}" for i in range(40)} and set(done.values()) == {1}
    # Two worker processes ran (which of them took which task is theirs to decide).
    assert len(group_pids(worker)) == 3  # the dramatiq main process and its two workers


def test_sigkilled_workers_lose_nothing_and_repeat_only_what_was_in_flight(
    redis_url, namespace, log, children, dq_broker
):
    work, _ = sender_actors(dq_broker)
    survivor = start_worker(children, redis_url, namespace, log, lease=KILL_LEASE, name="survivor")
    survivor.signal(signal.SIGSTOP)  # the victims take the work; resumed below
    sent: list[str] = []
    redeliveries: list[float] = []
    for trial in range(KILLS):
        victim = start_worker(children, redis_url, namespace, log, lease=KILL_LEASE, name="victim")
        keys = [f"t{trial}-{i}" for i in range(6)]
        sent += keys
        for key in keys:
            work.send(key, 0.4)
        # Kill it mid-task: a start without its done, by the victim.
        pids = group_pids(victim)
        wait_for(functools.partial(_running, log, pids, keys), 60, "a task running in the victim")
        killed_at = time.time()
        in_flight = _running(log, pids, keys)
        victim.kill()
        if trial == 0:
            survivor.signal(signal.SIGCONT)
        wait_for(functools.partial(_all_done, log, keys), 90, "every task of the trial")
        again = [e.at for e in events(log, "start") if e.words[0] in in_flight and e.at > killed_at]
        redeliveries.append(min(again) - killed_at)
    starts, dones = keys_of(log, "start"), keys_of(log, "done")
    assert set(dones) == set(sent)  # nothing lost
    assert max(dones.values()) <= 2 and max(starts.values()) <= 2
    print(
        f"redelivery after SIGKILL (s), lease {KILL_LEASE}: {[round(t, 2) for t in redeliveries]}"
    )
    twice = sorted(key for key, count in dones.items() if count > 1)
    print(f"{len(sent)} tasks, {len(set(sent) - set(dones))} lost, done twice: {twice}")
    assert len(redeliveries) == KILLS


def _all_done(log: Path, keys: list[str]) -> bool:
    return set(keys) <= set(keys_of(log, "done"))


def _running(log: Path, pids: set[int], keys: list[str]) -> set[str]:
    started = {e.words[0] for e in events(log, "start") if e.pid in pids and e.words[0] in keys}
    finished = {e.words[0] for e in events(log, "done") if e.pid in pids}
    return started - finished


def test_a_task_longer_than_the_lease_is_never_redelivered_while_it_runs(
    redis_url, namespace, log, children, dq_broker
):
    start_worker(children, redis_url, namespace, log, lease=1.0, name="a")
    start_worker(children, redis_url, namespace, log, lease=1.0, name="b")
    work, _ = sender_actors(dq_broker)
    key = f"long-{uuid.uuid4().hex[:6]}"
    work.send(key, 5.0)  # five leases
    wait_for(lambda: keys_of(log, "done")[key] == 1, 60, "the long task")
    assert keys_of(log, "start")[key] == 1


def test_a_cpu_bound_task_of_twice_the_lease_runs_once(
    redis_url, namespace, log, children, dq_broker
):
    start_worker(children, redis_url, namespace, log, lease=1.5, name="a")
    start_worker(children, redis_url, namespace, log, lease=1.5, name="b")
    _, spin = sender_actors(dq_broker)
    spin.send("cpu", 3.0)
    wait_for(lambda: keys_of(log, "done")["cpu"] == 1, 60, "the CPU-bound task")
    assert keys_of(log, "start")["cpu"] == 1


def test_a_worker_paused_past_its_lease_starts_none_of_its_prefetched_tasks(
    redis_url, namespace, log, children, dq_broker
):
    paused = start_worker(children, redis_url, namespace, log, lease=1.0, threads=1, name="paused")
    work, _ = sender_actors(dq_broker)
    keys = [f"p{i}" for i in range(4)]
    for key in keys:
        work.send(key, 1.0)
    pids = group_pids(paused)
    wait_for(functools.partial(_running, log, pids, keys), 60, "a task running")
    paused.signal(signal.SIGSTOP)  # past the lease: its reservations are recovered
    stopped_at = time.time()
    start_worker(children, redis_url, namespace, log, lease=1.0, threads=2, name="other")
    wait_for(functools.partial(_all_done, log, keys), 90, "every task, by the other worker")
    paused.signal(signal.SIGCONT)
    wait_for(lambda: "not started" in paused.output(), 30, "the fence of its prefetched task")
    late = [e for e in events(log, "start") if e.pid in pids and e.at > stopped_at]
    assert late == []  # nothing started after the pause
    assert max(keys_of(log, "start").values()) <= 2  # only the task in flight at the pause
