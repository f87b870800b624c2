"""SIGKILL ``taskiq worker`` processes at random points: nothing lost, duplicates only in flight.

Each trial is one namespace with 24 tasks and one victim ``taskiq worker``
(three tasks at a time, prefetch 3, lease 1 s) that is SIGKILLed with its whole process group at a
random moment: during start-up, while it holds tasks, or late enough that
it may have run out of work.
Then a survivor worker is started; it recovers the victim's expired
reservations and finishes the queue. Together with the 24 generator trials
of test_consumer_kill.py these are the suite's 32 consumer kills.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from simplebroker_redis.keys import Keyspace
from support.invariants import check_invariants
from support.processes import Process
from support.waiting import wait_for

from .faulthelpers import backend_connections
from .workers import events, start_worker

TRIALS = 8
TASKS = 24


@dataclass
class Trial:
    """One namespace, its tasks, its victim and survivor workers."""

    number: int
    log: Path
    namespace: str = field(default_factory=lambda: f"tqkill-{uuid.uuid4().hex[:10]}")
    in_flight: set[str] = field(default_factory=set)
    victim: Process | None = None
    victim_pids: set[int] = field(default_factory=set)
    survivor: Process | None = None

    def events(self) -> list[tuple[str, str, int]]:
        return events(self.log)

    def start(self, url: str, name: str) -> Process:
        return start_worker(url, self.namespace, self.log, self.log.with_suffix(f".{name}.out"))


def _group(pgid: int) -> set[int]:
    """Return the PIDs of process group ``pgid`` (the manager and its worker)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                pids.add(int(entry.name))
    return pids


def _task_key(body: str) -> str:
    from taskiq_simplebroker import decode_body

    return str(json.loads(decode_body(body))["args"][0])


async def _kick(url: str, trial: Trial, rng: random.Random) -> None:
    from taskiq.kicker import AsyncKicker

    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    producer = SimpleBrokerTaskiqBroker(url, namespace=trial.namespace, queue="work")
    await producer.startup()
    try:
        for n in range(TASKS):
            kicker: AsyncKicker[..., str] = AsyncKicker("faults:work", producer, {})
            # The first three (the victim's first reservation) outlast any lag
            # of the test's polling on a loaded machine, so a kill meant to land
            # mid-work finds tasks held.
            await kicker.kiq(f"t{n}", 1.5 if n < 3 else rng.uniform(0.02, 0.25))
    finally:
        await producer.shutdown()


async def _run(url: str, trial: Trial, raw: redis.Redis, rng: random.Random) -> None:
    trial.victim = trial.start(url, "victim")
    pgid = trial.victim.pid
    if trial.number % 4 == 1:
        await asyncio.sleep(rng.uniform(0.1, 1.5))  # mostly during start-up
    else:
        keys = Keyspace.for_namespace(trial.namespace)
        deadline = time.monotonic() + 30
        while not any(event == "start" for event, _, _ in trial.events()):
            assert time.monotonic() < deadline, "the victim never started a task"
            await asyncio.sleep(0.01)
        if trial.number % 4 == 3:  # possibly after the queue ran dry
            await asyncio.sleep(rng.uniform(0.4, 2))
        else:
            # Mid-work: while it holds tasks. Waiting for a reservation, not a
            # fixed delay: on a loaded machine the test's polling can lag the
            # worker by the whole queue.
            while not raw.zcard(keys.reserved) and raw.zcard(keys.pending):
                assert time.monotonic() < deadline, "the victim never held a task"
                await asyncio.sleep(0.005)
            await asyncio.sleep(rng.uniform(0.0, 0.05))
    trial.victim_pids = _group(pgid)
    trial.victim.kill()
    await asyncio.to_thread(
        wait_for,
        lambda: not any(backend_connections(raw, pid) for pid in trial.victim_pids),
        10,
        what="the server to drop the victim's connections",
    )
    keys = Keyspace.for_namespace(trial.namespace)
    reserved = [m.rsplit(" ", 1)[1] for m in raw.zrange(keys.reserved, 0, -1)]
    bodies = raw.hmget(keys.bodies, reserved) if reserved else []
    trial.in_flight = {_task_key(body) for body in bodies}
    trial.survivor = trial.start(url, "survivor")
    everything = {f"t{n}" for n in range(TASKS)}
    deadline = time.monotonic() + 60
    while {key for event, key, _ in trial.events() if event == "done"} != everything or (
        raw.zcard(keys.pending) or raw.zcard(keys.reserved)
    ):
        assert time.monotonic() < deadline, "the survivor did not finish the queue"
        await asyncio.sleep(0.05)
    trial.survivor.stop(10)


@pytest.fixture
def trials(tmp_path: Path, raw: redis.Redis) -> list[Trial]:
    made = [Trial(n, tmp_path / f"trial{n}.log") for n in range(TRIALS)]
    yield made
    for trial in made:
        for process in (trial.victim, trial.survivor):
            if process is not None:
                process.kill()
        for key in raw.scan_iter(match=Keyspace.for_namespace(trial.namespace).scan_pattern):
            raw.delete(key)


async def test_sigkill_taskiq_workers_at_random_points(redis_url, raw, trials):
    rng = random.Random(4242)
    for trial in trials:
        await _kick(redis_url, trial, rng)
    await asyncio.gather(*(_run(redis_url, t, raw, random.Random(rng.random())) for t in trials))
    busy = 0
    for trial in trials:
        events = trial.events()
        victim_starts = [
            key for event, key, pid in events if event == "start" and pid in trial.victim_pids
        ]
        assert len(victim_starts) == len(set(victim_starts)), "a live worker ran a task twice"
        starts = Counter(key for event, key, _ in events if event == "start")
        twice = {key for key, count in starts.items() if count > 1}
        assert twice <= trial.in_flight, (
            f"ran twice outside the killed worker's reservations: {twice - trial.in_flight}"
        )
        redone = {
            key for event, key, pid in events if event == "start" and pid not in trial.victim_pids
        }
        assert trial.in_flight <= redone, "a task the victim held was not delivered again"
        check_invariants(raw, trial.namespace)
        busy += bool(trial.in_flight)
    assert busy >= TRIALS // 2, "too few kills landed while the victim held tasks"
