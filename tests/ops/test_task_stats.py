"""Per task name statistics: counted in processes, added up in the server, bounded."""

from __future__ import annotations

import random
import threading
import time

import pytest
import redis

from simplebroker_redis import RedisRunner, calls
from simplebroker_redis.taskrecord import TaskRecord, bucket_of, bucket_upper, percentile
from simplebroker_redis.tasks import STATS_ENV, TaskStats, enabled


def now_minute() -> int:
    return int(time.time() // 60)


def read(
    runner: RedisRunner, minutes: int = 10
) -> tuple[dict[tuple[int, str], TaskRecord], dict[str, TaskRecord]]:
    page = runner.run(calls.task_stats_read(now_minute() - minutes, now_minute() + 1, totals=True))
    per_minute = {(m, name): TaskRecord.parse(text) for m, name, text in page.minutes}
    return per_minute, {name: TaskRecord.parse(text) for name, text in page.totals.items()}


def test_counts_and_execution_times_reach_the_server(runner: RedisRunner) -> None:
    stats = TaskStats(runner, interval=3600)
    stats.enqueued("mail.send", 3)
    stats.retried("mail.send")
    for seconds in (0.010, 0.020, 0.030, 2.0):
        stats.finished("mail.send", seconds, ok=seconds < 1)
    stats.finished("report.build", 0.5, ok=True)
    assert stats.flush() == 2
    assert stats.flush() == 0  # nothing new
    per_minute, totals = read(runner)
    mail = totals["mail.send"]
    assert (mail.enqueued, mail.done, mail.failed, mail.retried) == (3, 3, 1, 1)
    assert mail.sum_us == 2_060_000
    assert mail.runs == 4
    assert mail.percentile(0.5) == bucket_upper(bucket_of(0.020))
    assert mail.percentile(0.99) == bucket_upper(bucket_of(2.0))
    assert sum(r.done for (_, name), r in per_minute.items() if name == "report.build") == 1


def test_threads_counting_at_once_lose_nothing(runner: RedisRunner) -> None:
    stats = TaskStats(runner, interval=0.05)  # sends while the threads count

    def count() -> None:
        for _ in range(500):
            stats.enqueued("t")
            stats.finished("t", 0.001, ok=True)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats.close()
    total = read(runner)[1]["t"]
    assert (total.enqueued, total.done, total.runs) == (2000, 2000, 2000)


def test_two_processes_counts_add_up_and_agree_for_every_reader(
    runner: RedisRunner, redis_url: str, namespace: str
) -> None:
    other = RedisRunner(redis_url, namespace=namespace)
    try:
        for source in (runner, other):
            stats = TaskStats(source, interval=3600)
            stats.enqueued("shared", 5)
            stats.flush()
        assert read(runner)[1]["shared"].enqueued == 10
        assert read(other) == read(runner)
    finally:
        other.shutdown()


def test_counts_that_could_not_be_sent_are_kept_for_the_next_try(
    runner: RedisRunner, redis_url: str, namespace: str
) -> None:
    nowhere = RedisRunner("redis://127.0.0.1:1/0", namespace=namespace, pool_timeout=0.2)
    stats = TaskStats(nowhere, interval=3600)
    stats.enqueued("kept", 2)
    assert stats.flush() == 0
    stats.enqueued("kept", 1)
    stats.runner = runner
    assert stats.flush() == 1
    assert read(runner)[1]["kept"].enqueued == 3
    nowhere.shutdown()


def test_minutes_past_the_retention_are_dropped_and_names_are_bounded(
    runner: RedisRunner, raw: redis.Redis
) -> None:
    record = TaskRecord(done=1)
    old = now_minute() - 30
    runner.run(calls.task_stats([(old, "a", record)], retention_minutes=60, most_names=2))
    assert (old, "a") in read(runner, 60)[0]
    # A shorter retention: the old minute goes, the totals stay.
    runner.run(calls.task_stats([(now_minute(), "b", record)], retention_minutes=10, most_names=2))
    per_minute, totals = read(runner, 60)
    assert (old, "a") not in per_minute
    assert raw.zcard(runner.keys.task_minutes) == raw.hlen(runner.keys.task_stats) == 1
    # Past the name limit, new names count as "(other)".
    runner.run(calls.task_stats([(now_minute(), "c", record)], retention_minutes=10, most_names=2))
    totals = read(runner)[1]
    assert set(totals) == {"a", "b", "(other)"}
    # A process whose clock runs ahead counts in the server's current minute.
    runner.run(
        calls.task_stats([(now_minute() + 90, "a", record)], retention_minutes=10, most_names=2)
    )
    assert max(minute for minute, _ in read(runner)[0]) <= now_minute()


def test_statistics_are_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STATS_ENV, raising=False)
    assert enabled(None) is True
    monkeypatch.setenv(STATS_ENV, "0")
    assert enabled(None) is False
    assert enabled(True) is True  # an integration's explicit option wins
    monkeypatch.setenv(STATS_ENV, "1")
    assert enabled(False) is False


def test_percentiles_are_read_from_the_buckets_within_their_width() -> None:
    record = TaskRecord()
    times = [0.001 * i for i in range(1, 1001)]  # 1 ms to 1 s, evenly
    for seconds in times:
        record.run(seconds)
    for q in (0.5, 0.95, 0.99):
        exact = times[int(q * len(times)) - 1]
        got = record.percentile(q)
        assert got is not None and exact <= got <= exact * 2 ** (1 / 4) + 1e-12
    assert percentile({}, 0.5) is None
    assert TaskRecord.parse(record.encode()) == record


def test_the_server_adds_records_up_exactly_as_python_does(runner: RedisRunner) -> None:
    """Records of every spread of times, merged in Lua one send at a time."""
    rng = random.Random(44)
    expected = TaskRecord()
    minute = now_minute()
    for _ in range(120):
        record = TaskRecord(enqueued=rng.randint(0, 3), done=rng.randint(0, 3))
        for _ in range(rng.randint(0, 6)):
            record.run(10 ** rng.uniform(-5, 4))  # 10 µs to hours: first and last buckets too
        expected.add(record)
        runner.run(calls.task_stats([(minute, "t", record)], retention_minutes=10, most_names=5))
    per_minute, totals = read(runner)
    assert totals["t"] == expected == per_minute[(minute, "t")]
    assert TaskRecord.parse(expected.encode()) == expected
