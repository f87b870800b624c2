"""SIGKILL consumers at random points: nothing is lost, duplicates only in flight.

Each trial is one namespace with one consumer process running SimpleBroker's
at-least-once generator (``claim_generator`` or ``move_generator``) with
random batch sizes and random work per message. The consumer logs every
message it was handed before working on it, and is SIGKILLed after a random
delay: while reserving, yielding, committing or idle. After the batch lease
(``stale_batch_seconds``) runs out, the batch that was in flight is
recovered either by the next claim on the queue or by ``recover_stale()``,
and the queue is drained. Then:

- the killed consumer was never handed a message twice;
- every written message was consumed exactly once in the end (claimed, or
  moved to the target queue with its ID and body);
- a message delivered both before and after the kill was in the reservation
  in flight at the kill, and every message in flight was delivered again.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from simplebroker import resolve_config

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import Keyspace
from simplebroker_redis.namespace import cleanup
from support.invariants import check_invariants
from support.waiting import wait_for

from .faulthelpers import backend_connections

#: Lease of a generator batch in these tests (seconds).
STALE = 0.3

#: Trials run side by side, and rounds of them (24 trials in all).
PARALLEL = 4
ROUNDS = 6

MESSAGES = 100

NO_MAINTENANCE = resolve_config(override={"BROKER_AUTO_VACUUM": 0})


def _consume(url: str, namespace: str, queue: str, target: str, log: str, seed: int) -> None:
    rng = random.Random(seed)
    runner = RedisRunner(url, namespace=namespace, stale_batch_seconds=STALE)
    core = RedisBrokerCore(runner, config=NO_MAINTENANCE)
    with open(log, "a", encoding="utf-8") as out:
        while True:
            size = rng.randint(1, 7)
            if target:
                gen = core.move_generator(
                    queue, target, delivery_guarantee="at_least_once", batch_size=size
                )
            else:
                gen = core.claim_generator(
                    queue, delivery_guarantee="at_least_once", batch_size=size
                )
            for _body, message_id in gen:
                out.write(f"{message_id}\n")
                out.flush()
                time.sleep(rng.uniform(0, 0.008))
            time.sleep(0.005)


@dataclass
class Trial:
    """One namespace, its queue, its consumer and what it logged."""

    number: int
    url: str
    log: Path
    namespace: str = field(default_factory=lambda: f"kill-{uuid.uuid4().hex[:10]}")
    queue: str = "jobs"
    written: dict[int, str] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)
    process: multiprocessing.process.BaseProcess | None = None

    @property
    def target(self) -> str:
        """Every third trial moves instead of claiming."""
        return "done" if self.number % 3 == 2 else ""

    def core(self) -> RedisBrokerCore:
        runner = RedisRunner(self.url, namespace=self.namespace, stale_batch_seconds=STALE)
        return RedisBrokerCore(runner, config=NO_MAINTENANCE, owns_runner=True)


@pytest.fixture
def trials(redis_url: str, tmp_path: Path) -> Iterator[list[Trial]]:
    made = [
        Trial(number, redis_url, tmp_path / f"trial{number}.log")
        for number in range(PARALLEL * ROUNDS)
    ]
    yield made
    for trial in made:
        if trial.process is not None and trial.process.is_alive():
            trial.process.kill()
            trial.process.join(5)
        core = trial.core()
        cleanup(core.runner)
        core.shutdown()


def _kill(trial: Trial, raw: redis.Redis) -> None:
    process = trial.process
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert process.exitcode == -signal.SIGKILL
    # Once the server has dropped the dead consumer's connection it has run
    # every command it will ever run for it.
    wait_for(
        lambda: not backend_connections(raw, process.pid),
        timeout=10,
        what="the server to drop the killed consumer's connection",
    )
    reserved = Keyspace.for_namespace(trial.namespace).reserved
    trial.in_flight = {int(m.split()[1]) for m in raw.zrange(reserved, 0, -1)}


def _drain(trial: Trial, core: RedisBrokerCore) -> list[int]:
    if trial.number % 2:
        # Explicit recovery releases exactly the batch that was in flight.
        assert core.recover_stale() == len(trial.in_flight)
    if trial.target:
        gen = core.move_generator(
            trial.queue, trial.target, delivery_guarantee="at_least_once", batch_size=10
        )
    else:
        gen = core.claim_generator(trial.queue, delivery_guarantee="at_least_once", batch_size=10)
    # With no explicit recovery, this claim's upkeep recovers the stale batch.
    return [message_id for _body, message_id in gen]


def _check(trial: Trial, raw: redis.Redis) -> None:
    first = [int(line) for line in trial.log.read_text().split()] if trial.log.exists() else []
    assert len(first) == len(set(first)), "a live consumer was handed a message twice"
    core = trial.core()
    try:
        second = _drain(trial, core)
        assert len(second) == len(set(second))
        written = set(trial.written)
        assert set(first) | set(second) == written, "a message was lost"
        assert set(first) & set(second) <= trial.in_flight, "redelivered outside the killed batch"
        assert trial.in_flight <= set(second), "the batch in flight was not redelivered"
        source = core.get_queue_stat(trial.queue)
        assert (source.pending, source.claimed) == (0, 0 if trial.target else len(written))
        if trial.target:
            kept = {i: b for b, i in core.peek_many(trial.target, 1000)}
        else:
            kept = {i: b for b, i in core.peek_many(trial.queue, 1000, include_claimed=True)}
        assert kept == trial.written, "IDs or bodies changed"
        check_invariants(raw, trial.namespace)
    finally:
        core.shutdown()


def test_sigkill_at_least_once_generators_at_random_points(trials, raw):
    context = multiprocessing.get_context("fork")
    rng = random.Random(20240611)
    for round_number in range(ROUNDS):
        batch = trials[round_number * PARALLEL : (round_number + 1) * PARALLEL]
        for trial in batch:
            core = trial.core()
            trial.written = {core.write(trial.queue, f"m{i}"): f"m{i}" for i in range(MESSAGES)}
            core.shutdown()
            trial.process = context.Process(
                target=_consume,
                args=(
                    trial.url,
                    trial.namespace,
                    trial.queue,
                    trial.target,
                    str(trial.log),
                    rng.randrange(2**32),
                ),
                daemon=True,
            )
        started = time.monotonic()
        for trial in batch:
            trial.process.start()  # type: ignore[union-attr]
        for trial, delay in sorted(
            ((t, rng.uniform(0.01, 0.4)) for t in batch), key=lambda pair: pair[1]
        ):
            time.sleep(max(0.0, started + delay - time.monotonic()))
            _kill(trial, raw)
        time.sleep(STALE + 0.1)
        for trial in batch:
            _check(trial, raw)
