"""SIGKILL a process holding reservations: nothing lost, duplicates only in flight."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

from simplebroker_redis import Leases, RedisRunner
from simplebroker_redis.core import RedisBrokerCore

LEASE = 0.25
TRIALS = 20


def _consumer(url: str, namespace: str, queue: str, log: str) -> None:
    leases = Leases(RedisRunner(url, namespace=namespace))
    with open(log, "a", encoding="utf-8") as out:
        while True:
            lease = leases.reserve(queue, 4, LEASE)
            if not lease.messages:
                time.sleep(0.01)
                continue
            for message in lease.messages:
                out.write(f"{message.id}\n")
                out.flush()
                time.sleep(random.uniform(0, 0.01))
            leases.ack(lease.token)


def test_sigkill_at_random_points_loses_nothing(redis_url, namespace, raw, tmp_path: Path):
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    leases = Leases(core.runner)
    context = multiprocessing.get_context("fork")
    rng = random.Random(1234)
    token_ids_key = f"sb:{{{namespace}}}:token_ids"
    for trial in range(TRIALS):
        queue = f"kill{trial}"
        written = {core.write(queue, f"m{i}") for i in range(40)}
        log = tmp_path / f"delivered{trial}.log"
        child = context.Process(target=_consumer, args=(redis_url, namespace, queue, str(log)))
        child.start()
        time.sleep(rng.uniform(0.02, 0.25))
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        in_flight = {int(member.split()[1]) for member in raw.zrange(token_ids_key, 0, -1)}
        first = [int(line) for line in log.read_text().split()] if log.exists() else []
        assert len(first) == len(set(first)), "a live worker was handed a message twice"
        time.sleep(LEASE + 0.05)
        assert leases.recover(queue).released == len(in_flight)
        second = []
        while True:
            lease = leases.reserve(queue, 10, 30)
            if not lease.messages:
                break
            second.extend(lease.ids)
            leases.ack(lease.token)
        claimed = {i for _, i in core.peek_many(queue, 100, include_claimed=True)}
        assert claimed == written, "a message was lost"
        assert set(first) | set(second) == written
        assert set(first) & set(second) <= in_flight, "redelivered outside the killed batch"
        assert in_flight <= set(second)
        assert core.get_queue_stat(queue).pending == 0
