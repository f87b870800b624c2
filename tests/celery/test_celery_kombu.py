"""kombu's contracts that Celery's Redis transport meets, on ours (see ``make peer-tests-kombu``).

Failover to alternate URLs, requeues and hand-backs that are immediate and
marked redelivered, connection failures in the types Celery users catch,
the Redis priority order, and ``celery control shutdown`` as with Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Producer, Queue
from simplebroker.ext import OperationalError

import celery_simplebroker  # noqa: F401 - registers the transport aliases
from celery_simplebroker import AuthenticationFailed, ConnectTimedOut, ServerUnreachable
from celery_simplebroker.errors import typed_connection_errors
from celery_simplebroker.options import ConfigurationError, client_target
from simplebroker_redis.devserver import free_port


@pytest.fixture
def options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "lease_seconds": 30.0}


@pytest.fixture
def conn(redis_url: str, options: dict[str, Any]) -> Iterator[Connection]:
    connection = Connection(f"simplebroker+{redis_url}", transport_options=options)
    yield connection
    connection.release()


def publish(conn: Connection, queue: str, *bodies: Any, **kwargs: Any) -> None:
    producer = Producer(conn.default_channel)
    for body in bodies:
        producer.publish(body, routing_key=queue, serializer="json", **kwargs)


def drain(conn: Connection, queue: str) -> list[Any]:
    taken = []
    while (message := conn.default_channel.basic_get(queue)) is not None:
        taken.append(message.payload)
        message.ack()
    return taken


# -- failover ----------------------------------------------------------------------------


def test_a_dead_first_url_fails_over_to_the_alternate(server, options):
    live = f"simplebroker+redis://127.0.0.1:{server.port}/0"
    with Connection(
        f"simplebroker+redis://127.0.0.1:{free_port()}/0;{live}", transport_options=options
    ) as conn:
        conn.connect()
        assert conn.transport_cls == "simplebroker+redis"  # kombu resolved the alternate's scheme
        assert conn.port == server.port
        assert conn.transport.target == f"redis://127.0.0.1:{server.port}/0"
        assert conn.as_uri() == live
        publish(conn, "jobs", "over")
        assert drain(conn, "jobs") == ["over"]


def test_a_worker_started_on_failover_urls_runs_tasks(app, start_worker, server):
    dead, live = free_port(), f"simplebroker+redis://127.0.0.1:{server.port}/0"
    urls = f"simplebroker+redis://127.0.0.1:{dead}/0;{live}"
    start_worker("w1", env={"CELERY_CONF": json.dumps({"broker_url": urls})})
    app.conf.broker_url = urls
    assert app.send_task("add", (2, 3)).get(timeout=60) == 5


@pytest.mark.parametrize(
    ("alternate", "target"),
    [
        ("simplebroker+redis://h:6380/2", "redis://h:6380/2"),
        ("simplebroker+redis://h", "redis://h"),
        ("simplebroker+rediss://app:p%40ss@h:6390/1", "rediss://app:p%40ss@h:6390/1"),
        ("simplebroker+redis://:only@h:1", "redis://:only@h:1"),
        ("simplebroker+unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_an_alternate_url_is_put_back_together_from_kombus_parts(alternate, target):
    conn = Connection("simplebroker+redis://first:1/0")
    conn.switch(alternate)  # what a failover does: kombu parses the alternate into parts
    assert client_target(conn).target == target


def test_a_cluster_or_sentinel_target_is_refused_as_an_alternate(server):
    urls = f"simplebroker+redis+cluster://a:1,b:2;simplebroker+redis://127.0.0.1:{server.port}/0"
    with pytest.raises(ConfigurationError, match="fails over on its own"):
        Connection(urls).connect()


# -- requeue and hand-back ---------------------------------------------------------------------


def test_a_requeued_message_is_back_at_once_marked_redelivered(conn):
    publish(conn, "jobs", "again")
    channel = conn.default_channel
    first = channel.basic_get("jobs")
    assert "redelivered" not in first.headers and not first.delivery_info["redelivered"]
    first.requeue()  # the lease (30 s) is not what brings it back
    second = channel.basic_get("jobs", no_ack=True)
    assert second.payload == "again"
    assert second.headers["redelivered"] is True and second.delivery_info["redelivered"]
    assert channel.basic_get("jobs") is None


def test_a_closed_connection_hands_its_unacknowledged_messages_back_at_once(redis_url, options):
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as holder:
        publish(holder, "jobs", "held", "buffered")
        channel = holder.channel()
        assert channel.basic_get("jobs").payload == "held"  # delivered, unacknowledged
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
        got = other.default_channel.basic_get("jobs")
        assert got.payload == "held" and got.headers["redelivered"] is True
        got.ack()
        assert drain(other, "jobs") == ["buffered"]


# -- connection failures --------------------------------------------------------------------


def test_a_wrong_password_is_an_authentication_error_kombu_retries(make_server, namespace):
    server = make_server("pw", extra_args=["--requirepass", "right-one"])
    url = f"simplebroker+redis://:wrong-one@127.0.0.1:{server.port}/0"
    with Connection(url, transport_options={"namespace": namespace}) as conn:
        with pytest.raises(redis.AuthenticationError) as raised:
            conn.connect()
        assert isinstance(raised.value, AuthenticationFailed)
        assert isinstance(raised.value, OperationalError)  # SimpleBroker's type too
        assert raised.type in conn.transport.connection_errors
        assert "wrong-one" not in str(raised.value)
        errors: list[BaseException] = []
        with pytest.raises(Exception) as final:  # as Celery's broker-connection retry loop does
            conn.ensure_connection(
                errback=lambda exc, interval: errors.append(exc), max_retries=2, interval_start=0
            )
        assert [type(e) for e in errors] == [AuthenticationFailed, AuthenticationFailed]
        assert isinstance(final.value.__cause__, AuthenticationFailed)


def test_no_password_for_a_server_that_wants_one_is_an_authentication_error(make_server, namespace):
    server = make_server("pw", extra_args=["--requirepass", "right-one"])
    url = f"simplebroker+redis://127.0.0.1:{server.port}/0"
    with Connection(url, transport_options={"namespace": namespace}) as conn:
        with pytest.raises(AuthenticationFailed, match="requires a password"):
            conn.connect()


def test_a_port_nobody_listens_on_is_a_connection_error(namespace):
    url = f"simplebroker+redis://127.0.0.1:{free_port()}/0"
    with Connection(url, transport_options={"namespace": namespace}) as conn:
        with pytest.raises(redis.ConnectionError) as raised:
            _ = conn.connection
        assert raised.type is ServerUnreachable
        assert raised.type in conn.transport.connection_errors


@pytest.mark.parametrize(
    ("cause", "typed"),
    [
        (redis.TimeoutError("Timeout connecting to server"), ConnectTimedOut),
        (redis.AuthenticationError("invalid username-password pair"), AuthenticationFailed),
        (redis.ConnectionError("Error 111 connecting"), ServerUnreachable),
        (redis.ResponseError("NOPERM"), OperationalError),  # not a connection failure: kept
    ],
)
def test_the_backends_connection_failures_get_redis_types(cause, typed):
    with pytest.raises(typed) as raised, typed_connection_errors():
        raise OperationalError("cannot reach Redis at redis://h:1/0") from cause
    assert raised.value.__cause__ is cause
    assert str(raised.value) == "cannot reach Redis at redis://h:1/0"


# -- priorities ----------------------------------------------------------------------------


def test_the_redis_priority_order_reads_zero_first(redis_url, options):
    ordered = {**options, "priority_order": "redis"}
    with Connection(f"simplebroker+{redis_url}", transport_options=ordered) as conn:
        for body, priority in [("low", 9), ("none", None), ("mid", 5), ("top", 0), ("mid2", 5)]:
            publish(conn, "jobs", body, priority=priority)
        assert drain(conn, "jobs") == ["none", "top", "mid", "mid2", "low"]


def test_the_default_priority_order_reads_nine_first(conn):
    for body, priority in [("low", 0), ("none", None), ("mid", 5), ("top", 9)]:
        publish(conn, "jobs", body, priority=priority)
    assert drain(conn, "jobs") == ["top", "mid", "low", "none"]


def test_an_unknown_priority_order_is_refused(redis_url, options):
    with pytest.raises(ConfigurationError, match="priority_order"):
        Connection(
            f"simplebroker+{redis_url}", transport_options={**options, "priority_order": "asc"}
        ).connect()


def test_workers_with_either_order_share_the_queues_storage(redis_url, options, namespace):
    """The order changes only how a worker reads: the stored queues are the same."""
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as conn:
        publish(conn, "jobs", "nine", priority=9)
        publish(conn, "jobs", "zero", priority=0)
    redis_order = {**options, "priority_order": "redis"}
    with Connection(f"simplebroker+{redis_url}", transport_options=redis_order) as conn:
        assert conn.default_channel.queue_declare(queue=Queue("jobs").name).message_count == 2
        assert drain(conn, "jobs") == ["zero", "nine"]


# -- remote control, side by side with Celery's Redis transport ---------------------------


@pytest.mark.parametrize("transport", ["simplebroker", "redis"])
def test_control_shutdown_reports_as_it_does_with_celerys_redis_transport(
    start_worker, celery_env, redis_url, namespace, transport
):
    """The worker stops (exit 0); the CLI, which asked for replies, gets none (exit 69).

    A worker's shutdown command stops it before it replies: Celery's
    behaviour with either transport.
    """
    conf: dict[str, Any] = {}
    if transport == "redis":  # kombu's own transport, its keys under this test's prefix
        options = {"global_keyprefix": f"{namespace}:"}
        conf = {"broker_url": redis_url, "broker_transport_options": options}
    env = {"CELERY_CONF": json.dumps(conf)}
    worker = start_worker("w1", env=env)
    shutdown = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "celeryapp", "control", "shutdown"],
        env={**celery_env, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.process.wait(timeout=30) == 0
    assert shutdown.returncode == 69, shutdown
    assert "No nodes replied within time constraint" in shutdown.stderr + shutdown.stdout


def test_celery_report_names_the_driver_and_its_version(celery_env):
    """``celery -A proj report``: ``simplebroker-redis:<version> (redis-py <version>)``, not N/A."""
    from importlib.metadata import version

    report = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "celeryapp", "report"],
        env=celery_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    driver = f"simplebroker-redis:{version('simplebroker-redis')} (redis-py {redis.__version__})"
    assert driver in report.stdout, report.stdout
    assert "N/A" not in report.stdout.split("platform ->")[0], report.stdout
