"""A healthy worker never takes its own settlements for leases another worker took over.

The event loop checks, every quarter of a second, whether tasks delivered
to this worker were taken over by another one (``Poller._check_leases``),
and restarts Celery's consumer when they were. Tasks are settled meanwhile
elsewhere: in a threads pool the result's script acknowledges a task, and
Celery acknowledges it, in the pool's thread. A check that ran between a
settlement and kombu forgetting the delivery read the token, no longer
held, as lost: ``LeasesRanOut`` on a worker nothing had happened to, a
consumer restart, its delivered tasks handed back, "acknowledged after its
lease expired" (issue 42). Many quick tasks make such checks likely; none
may say anything was lost.

The interleavings themselves are replayed one by one on a kombu connection
in this process (the event loop's check run at the worst moment of each
settlement), next to the two a takeover really produces, which must still
raise.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Producer

import celery_simplebroker  # noqa: F401 - registers the transport alias
from celery_simplebroker.envelope import parse_tag
from celery_simplebroker.errors import LeasesRanOut
from support.eventlog import read_events
from support.processes import Process
from support.waiting import wait_for

#: Tasks of a burst: enough that several lease checks land amid settlements.
BURST = 400

#: What a worker logs only when a lease was (or is taken for) lost.
FALSE_ALARMS = (
    "LeasesRanOut",
    "Connection to broker lost",
    "acknowledged after its lease expired",
    "not started",
    "Restoring",
    "ran out before this process could renew",
)


def done(events: Any) -> Counter[str]:
    """Return how many times each task key ran to its end."""
    return Counter(event.words[0] for event in read_events(events, "done"))


def false_alarms(worker: Process) -> list[str]:
    output = worker.output()
    return [line for line in output.splitlines() if any(text in line for text in FALSE_ALARMS)]


@pytest.mark.parametrize(
    ("pool", "concurrency", "acks_late", "results"),
    [
        ("threads", 4, True, True),  # the issue's: the result's script acknowledges in a thread
        ("threads", 4, False, False),  # acknowledged in the pool's thread as the task starts
        ("solo", 1, True, True),
        ("prefork", 2, True, True),
    ],
)
def test_a_burst_of_quick_tasks_reports_no_lease_lost(
    app, start_worker, events, pool, concurrency, acks_late, results
):
    # One task per reservation (as the operations tests' app): each task's
    # settlement lets its token go, and each is a chance for the race.
    conf = {"task_ignore_result": not results, "worker_prefetch_multiplier": 1}
    worker = start_worker(
        "w",
        pool=pool,
        concurrency=concurrency,
        acks_late=acks_late,
        env={"CELERY_CONF": json.dumps(conf)},
    )
    keys = [f"q{i}" for i in range(BURST)]
    for key in keys:
        app.send_task("record", (key, 0), ignore_result=not results)
    wait_for(lambda: set(done(events)) >= set(keys), 120, f"{BURST} tasks")
    assert false_alarms(worker) == []
    assert worker.stop() == 0
    assert false_alarms(worker) == []
    assert set(done(events).values()) == {1}  # no consumer restart ran a task twice


# -- the interleavings, one by one, in this process ---------------------------------------


@pytest.fixture
def conn(redis_url: str, namespace: str) -> Iterator[Connection]:
    connection = Connection(
        f"simplebroker+{redis_url}",
        transport_options={"namespace": namespace, "lease_seconds": 30.0},
    )
    yield connection
    connection.release()


def delivered(conn: Connection) -> tuple[Any, Any, str, int]:
    """Deliver one message as a worker's consumer does: (channel, message, token, id).

    The heartbeat is stopped: each test renews (or not) at the moment it means to.
    """
    Producer(conn.default_channel).publish("x", routing_key="jobs", serializer="json")
    channel = conn.channel()
    message = channel.basic_get("jobs")
    assert message is not None
    conn.transport.store.heartbeat.stop()
    token, message_id = parse_tag(message.delivery_tag)
    return channel, message, token, message_id


def check_leases(conn: Connection) -> None:
    """Run the event loop's lease check now (it runs every 0.25 s on the hub's tick)."""
    poller = conn.transport.poller
    poller._next_lease_check = 0.0
    poller._check_leases()


def test_a_task_whose_result_script_is_acknowledging_it_is_not_taken_over(conn, caplog):
    """The result's script (threads pool, ``acks_late``) lets the token go before it runs."""
    channel, message, token, message_id = delivered(conn)
    store = conn.transport.store
    assert store.acks.begin(token, message_id)  # what the result backend does first
    check_leases(conn)  # the event loop's check while the script is on its way
    settlement = store.leases.ack(token, [message_id], delete=True)  # the script's step
    check_leases(conn)  # landed, not confirmed to the transport yet
    store.acks.confirmed(token, message_id, settlement)
    message.ack()  # Celery's own, which costs nothing now
    check_leases(conn)
    assert "acknowledged after its lease expired" not in caplog.text


def test_a_task_acknowledged_in_another_thread_is_not_taken_over(conn, caplog):
    """Settled on the server and let go, its tag not out of kombu's delivered set yet."""
    channel, message, token, message_id = delivered(conn)
    qos = channel.qos
    quick_ack = qos._quick_ack

    def check_then_forget(tag: str) -> None:
        check_leases(conn)  # the event loop's turn, between the two steps of QoS.ack
        quick_ack(tag)

    qos._quick_ack = check_then_forget
    message.ack()
    assert conn.transport.store.leases.renew([token]) == {token}  # it was settled
    assert "acknowledged after its lease expired" not in caplog.text


def test_an_expired_lease_settled_meanwhile_is_not_taken_over(conn):
    """Past its known deadline, the renewal the check makes finds it gone: its ack landed."""
    channel, message, token, message_id = delivered(conn)
    store = conn.transport.store
    store.holdings.renewed([token], 0)  # its known deadline passed (a long stall)
    leases = store.leases
    ack = leases.ack

    def ack_then_check(*args: Any, **kwargs: Any) -> Any:
        settled = ack(*args, **kwargs)  # the server dropped the token
        check_leases(conn)  # before the acknowledgement's reply is handled
        return settled

    leases.ack = ack_then_check
    message.ack()


def test_a_delivered_task_taken_over_still_restarts_the_consumer(conn, caplog):
    """The heartbeat found the token gone while the task was not being settled."""
    channel, message, token, message_id = delivered(conn)
    store = conn.transport.store
    store.leases.release(token)  # as another worker's recovery of an expired lease would
    with caplog.at_level(logging.WARNING, logger="celery_simplebroker"):
        store.heartbeat._renew(store.leases)  # the heartbeat's next renewal, now
    assert "ran out before this process could renew" in caplog.text
    with pytest.raises(LeasesRanOut):
        check_leases(conn)


def test_a_delivered_task_past_its_deadline_and_taken_over_restarts_the_consumer(conn):
    """The check's own renewal finds it gone, with nothing of it being settled here."""
    channel, message, token, message_id = delivered(conn)
    store = conn.transport.store
    store.holdings.renewed([token], 0)
    store.leases.release(token)
    with pytest.raises(LeasesRanOut):
        check_leases(conn)
