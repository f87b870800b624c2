"""What the dashboard and the Prometheus exporter see of Dramatiq workers and queues.

Both read the namespace through ``observe.read_namespace``: the workers'
heartbeat records (kind ``dramatiq``, the queues they consume) and every
queue's depths, with ``<queue>.XQ`` counted as a dead-letter queue; and
the task statistics the broker's middleware counts per actor.
"""

from __future__ import annotations

import time

from dqhelpers import keys_of, sender_actors, start_worker
from dramatiq import Message

from simplebroker_redis.ops.observe import read_namespace
from support.waiting import wait_for


def test_workers_and_queues_are_seen(redis_url, namespace, children, tmp_path, dq_broker):
    log = tmp_path / "events.log"
    start_worker(children, redis_url, namespace, log, processes=2, threads=2)

    def dramatiq_workers() -> list:
        state = read_namespace(dq_broker.runner)
        return [w for w in state.live_workers() if w.info.get("kind") == "dramatiq"]

    workers = wait_for(lambda: len(dramatiq_workers()) == 2 and dramatiq_workers(), 60, "records")
    assert all(w.info["queues"] == ["default"] for w in workers)
    work, _ = sender_actors(dq_broker)
    work.send("x")
    wait_for(lambda: keys_of(log, "done"), 60, "the task")
    consumer = dq_broker.consume("other", prefetch=1, timeout=100)
    dq_broker.enqueue(Message(queue_name="other", actor_name="a", args=(), kwargs={}, options={}))
    held = wait_for(lambda: next(consumer), 30, "the message")
    consumer.nack(held)
    consumer.close()
    state = read_namespace(dq_broker.runner)
    assert "other.XQ" in state.dead_letter_queues
    assert state.queue("other.XQ").pending == 1


def test_runs_are_counted_per_actor_for_the_dashboard(make_broker, make_worker):
    """Sent, retried (the Retries middleware), failed and done, with execution times."""
    import dramatiq

    from simplebroker_redis import calls
    from simplebroker_redis.taskrecord import TaskRecord

    broker = make_broker()
    attempts: list[str] = []

    @dramatiq.actor(
        broker=broker, actor_name="ops.once_flaky", max_retries=3, min_backoff=10, max_backoff=50
    )
    def once_flaky(key: str) -> None:
        attempts.append(key)
        if len(attempts) == 1:
            raise ValueError("the first run fails")

    once_flaky.send("a")
    make_worker(broker)

    def counted() -> TaskRecord | None:
        assert broker.task_stats is not None
        broker.task_stats.flush()
        now = int(time.time() // 60)
        page = broker.runner.run(calls.task_stats_read(now - 5, now + 1, totals=True))
        text = page.totals.get("ops.once_flaky")
        record = TaskRecord.parse(text) if text else None
        return record if record is not None and record.done == 1 else None

    record = wait_for(counted, 30, "the runs' counts")
    assert (record.enqueued, record.retried, record.failed, record.done) == (1, 1, 1, 1)
    assert record.runs == 2 and attempts == ["a", "a"]
