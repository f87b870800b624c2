"""Real ``celery worker`` processes on a Redis Cluster and behind Sentinel.

The single-server runs are the rest of this directory; here the same app
is pointed at ``redis+cluster://`` and ``redis+sentinel://`` targets (the
test suite's shared cluster and Sentinel group, tests/conftest.py).
"""

from __future__ import annotations

import time

import pytest
from celery import chain, chord, group

from support.eventlog import read_events
from support.waiting import wait_for

#: Run on the shared cluster and Sentinel group only (tests/conftest.py).
TOPOLOGIES = ("cluster", "sentinel")


@pytest.fixture
def lease() -> float:
    return 3.0


def test_canvas_eta_and_remote_control(app, start_worker, events, topology):
    start_worker("w1")
    assert app.send_task("add", (2, 3)).get(timeout=30) == 5
    assert chain(app.signature("add", (1, 2)), app.signature("mul", (10,)))().get(timeout=30) == 30
    assert group(app.signature("add", (i, i)) for i in range(5))().get(timeout=30) == [
        0,
        2,
        4,
        6,
        8,
    ]
    header = [app.signature("record", (f"k{i}",)) for i in range(6)]
    assert chord(header)(app.signature("collect")).get(timeout=60) == [f"k{i}" for i in range(6)]
    assert len([e for e in read_events(events) if e.kind == "body"]) == 1
    started = time.time()
    assert app.send_task("record", ("eta",), countdown=2).get(timeout=60) == "eta"
    run = next(e for e in read_events(events) if e.kind == "start" and e.words[0] == "eta")
    assert run.at >= started + 1.9
    # Remote control goes through the fanout exchange (wake-ups on sharded Pub/Sub).
    replies = app.control.inspect(timeout=5).ping()
    assert replies is not None and any(name.startswith("w1@") for name in replies), topology


def test_a_killed_workers_task_runs_again_on_another_worker(app, start_worker, events):
    victim = start_worker("victim")
    result = app.send_task("record", ("long", 30.0))

    def running() -> bool:
        log = read_events(events)
        return any(e.kind == "start" and e.pid == victim.pid for e in log)

    wait_for(running, 30, "the victim to start the task")
    victim.kill()
    killed = time.time()
    heir = start_worker("heir")
    # The task sleeps 30 s once re-run; what matters is that it starts again soon.
    wait_for(
        lambda: any(e.kind == "start" and e.pid == heir.pid for e in read_events(events)),
        30,
        "the heir to run the dead worker's task",
    )
    restarted = next(e for e in read_events(events) if e.kind == "start" and e.pid == heir.pid)
    assert restarted.at - killed < 15
    assert result.state != "SUCCESS"


def test_a_queues_size_and_purge_count_every_priority(app, topology):
    """kombu's ready count (``celery inspect``, ``purge``) reads the ten priority queues at once."""
    from kombu import Producer

    with app.connection_for_write() as conn:
        producer = Producer(conn.default_channel)
        for priority in (0, 0, 5, 9, 9, 9):
            producer.publish(
                {"p": priority}, routing_key="sized", serializer="json", priority=priority
            )
        channel = conn.default_channel
        assert channel.queue_declare("sized", passive=True).message_count == 6, topology
        assert channel.queue_purge("sized") == 6
        assert channel.queue_declare("sized", passive=True).message_count == 0
