"""What no retry can fix fails at once, everywhere; a server not up yet is waited for.

A malformed target, a missing or wrong password, an ACL denial, a server's
answer (a database number out of range), a ``rediss://`` URL on a plain-text
port: the CLI, ``Queue``, the Taskiq classes and Celery (client and worker)
report them in well under the 6 s that SimpleBroker's connection retry
sleeps (2 s, then 4 s) before it gives up (a TLS mismatch after the one
handshake that reveals it). A server that is merely not reachable yet is
still retried, and reached when it comes up within that window.

The bounds are generous (seconds, on a busy 2-core machine); what they
tell apart is "retried for 6 s" from "reported at once".
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from simplebroker import BrokerTarget, Queue

from simplebroker_redis import AccessDenied, AsyncRedisRunner, InvalidTarget, RedisRunner
from simplebroker_redis.connection import CONNECT_TIMEOUT
from simplebroker_redis.devserver import DevServer, free_port
from simplebroker_redis.errors import Rejected
from simplebroker_redis.targets import ACCEPTED_FORMS
from support.processes import pythonpath

from .faulthelpers import QUOTED, SECRET, assert_secret_free, broker_cli, write_project

#: Seconds an in-process operation may take to report a refusal. SimpleBroker's
#: retry sleeps 2 s, then 4 s, so retrying takes at least 6; the margin is for
#: a loaded CI machine.
AT_ONCE = 4.0
#: Seconds a ``broker`` command may take to report a refusal beyond what the
#: same command takes to succeed just before it (its interpreter's start-up,
#: which a busy machine stretches by seconds); retrying adds at least 6.
CLI_AT_ONCE = 3.5

CELERY_TESTS = Path(__file__).resolve().parents[1] / "celery"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server that requires SECRET, with an ACL user allowed nothing but to log in."""
    server = DevServer(
        data_dir=str(tmp_path_factory.mktemp("fail-fast")), extra_args=["--requirepass", SECRET]
    )
    server.start()
    admin = redis.Redis(port=server.port, password=SECRET, decode_responses=True)
    admin.execute_command("ACL", "SETUSER", "nobody", "on", ">nobody-pw", "-@all", "+hello")
    admin.close()
    yield server
    server.stop()


def _typos(port: int) -> dict[str, tuple[str, str]]:
    """Typos of the working URL ``redis://127.0.0.1:<port>/0``, and the fault each is named by."""
    return {
        "one-slash": (f"redis:/127.0.0.1:{port}/0", "'redis:' must be followed by '//'"),
        "empty-port": ("redis://127.0.0.1:/0", "the port must be a number 1-65535"),
        "word-port": ("redis://127.0.0.1:6379x/0", "the port must be a number 1-65535"),
        "stray-path": (f"redis://127.0.0.1:{port}/0/jobs", "unexpected path '/0/jobs'"),
        "unknown-option": (f"redis://127.0.0.1:{port}/0?sockettimeout=5", "unknown option"),
    }


def _timed(operation: Callable[[], Any]) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        operation()
    except Exception as exc:  # noqa: BLE001 - the error is what is checked
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


# -- a malformed target -------------------------------------------------------------------


@pytest.mark.parametrize("typo", list(_typos(0)))
def test_python_entry_points_refuse_a_typo_with_one_message(auth_server, typo):
    from taskiq_simplebroker import (
        ConfigurationError,
        SimpleBrokerResultBackend,
        SimpleBrokerScheduleSource,
        SimpleBrokerTaskiqBroker,
    )

    target, fault = _typos(auth_server.port)[typo]
    options = {"namespace": "typo"}
    operations: dict[str, Callable[[], Any]] = {
        "runner": lambda: RedisRunner(target, namespace="typo"),
        "queue": lambda: Queue("jobs", db_path=BrokerTarget("redis", target, options)).write("x"),
        "taskiq broker": lambda: SimpleBrokerTaskiqBroker(target, namespace="typo"),
        "result backend": lambda: SimpleBrokerResultBackend(url=target, namespace="typo"),
        "schedule source": lambda: SimpleBrokerScheduleSource(url=target, namespace="typo"),
    }
    for name, operation in operations.items():
        error, took = _timed(operation)
        assert isinstance(error, (InvalidTarget, ConfigurationError)), (name, error)
        assert fault in str(error) and str(error).endswith(ACCEPTED_FORMS), (name, str(error))
        assert took < AT_ONCE, (name, took)


def _cli_start_up(auth_server: Any, tmp_path: Path) -> float:
    """Seconds a ``broker write`` that succeeds takes now: the baseline of a refusal's time."""
    url = f"redis://:{QUOTED}@127.0.0.1:{auth_server.port}/0"
    project = write_project(tmp_path / "baseline", url, "baseline")
    started = time.monotonic()
    result = broker_cli(project, "write", "jobs", "x")
    assert result.returncode == 0, result.stderr
    return time.monotonic() - started


def test_the_cli_refuses_a_typo_at_once_and_writes_nothing(auth_server, tmp_path):
    for case, (target, fault) in _typos(auth_server.port).items():
        # `write` is the command SimpleBroker's connection retry used to hold for 6 s.
        project = write_project(tmp_path / case, target, "typo")
        start_up = _cli_start_up(auth_server, tmp_path)
        started = time.monotonic()
        result = broker_cli(project, "write", "jobs", "x")
        took = time.monotonic() - started - start_up
        assert result.returncode != 0, (case, result)
        assert fault in result.stderr and ACCEPTED_FORMS in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert took < CLI_AT_ONCE, (case, took)
    admin = redis.Redis(port=auth_server.port, password=SECRET)
    assert list(admin.scan_iter("sb:{typo}:*")) == []  # nothing reached the server
    admin.close()


def _celery_app(url: str) -> Any:
    from celery import Celery

    import celery_simplebroker  # noqa: F401 - the transport and the URL checks

    app = Celery("typo", set_as_current=True)
    app.conf.update(broker_url=url, result_backend=url)
    return app


@pytest.mark.parametrize("typo", ["one-slash", "empty-port", "stray-path"])
def test_celery_refuses_a_typo_before_it_connects(auth_server, typo):
    target, fault = _typos(auth_server.port)[typo]
    # A client that sends before its app is finalized (Celery imports the
    # backend URL as a module name first), and an app that is finalized.
    for step in ("send", "finalize"):
        app = _celery_app(f"simplebroker+{target}")
        send = app.send_task
        operation = (lambda send=send: send("add", (1, 2))) if step == "send" else app.finalize
        error, took = _timed(operation)
        assert error is not None and fault in str(error), (step, repr(error))
        assert "No module named" not in str(error)
        assert took < AT_ONCE, (step, took)
        app.close()


def _celery_worker_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        **env,
        "PYTHONPATH": pythonpath(CELERY_TESTS),
        "CELERY_NS": "failfast",
        "CELERY_LOG": str(tmp_path / "events.log"),
    }


_WORKER = [sys.executable, "-m", "celery", "-A", "celeryapp", "worker", "-P", "solo"] + [
    "--without-mingle",
    "--without-gossip",
    "--without-heartbeat",
]


def test_a_celery_worker_stops_at_once_on_a_typo(auth_server, tmp_path):
    url, expected = _typos(auth_server.port)["one-slash"]
    started = time.monotonic()
    process = subprocess.run(
        _WORKER,
        env=_celery_worker_env({"SIMPLEBROKER_REDIS_URL": url}, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output, took = process.stdout + process.stderr, time.monotonic() - started
    assert process.returncode != 0 and expected in output, output[-3000:]
    # A typo is not a connection error: not kombu's "Trying again ... (1/100)".
    assert "Trying again" not in output, output[-3000:]
    assert took < 30, took
    assert_secret_free(output)


def test_a_celery_worker_names_a_wrong_password_at_once_and_retries_as_on_redis(
    auth_server, tmp_path
):
    """Celery's Redis transport retries a wrong password (a connection error): so does ours.

    What the user sees at once is the first retry's log line, which names the
    refusal.
    """
    url = f"redis://:{QUOTED}X@127.0.0.1:{auth_server.port}/0"
    log = tmp_path / "worker.out"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            _WORKER,
            env=_celery_worker_env({"SIMPLEBROKER_REDIS_URL": url}, tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "Trying again" not in log.read_text(errors="replace"):
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
    finally:
        worker.kill()
        worker.wait(timeout=30)
    output = log.read_text(errors="replace")
    # kombu's "consumer: Cannot connect to <url>: <our message>", then "Trying again ...".
    first = next(line for line in output.splitlines() if "Cannot connect to" in line)
    assert "cannot authenticate" in first, first
    assert_secret_free(output)


# -- refusals of the server ---------------------------------------------------------------


def _refusals(port: int) -> dict[str, tuple[str, dict[str, str], str]]:
    """Targets the server refuses for good: (URL, environment, what the error says)."""
    url = f"redis://127.0.0.1:{port}/0"
    return {
        "wrong-password": (f"redis://:{QUOTED}X@127.0.0.1:{port}/0", {}, "cannot authenticate"),
        "no-password": (url, {}, "requires a password and none was given"),
        "environment": (url, {"BROKER_BACKEND_PASSWORD": SECRET + "X"}, "cannot authenticate"),
        "acl": (f"redis://nobody:nobody-pw@127.0.0.1:{port}/0", {}, "denied access"),
    }


def test_queue_reports_a_refusal_at_once(auth_server, monkeypatch):
    for case, (url, env, expected) in _refusals(auth_server.port).items():
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            target = BrokerTarget("redis", url, {"namespace": "refused"})
            error, took = _timed(lambda target=target: Queue("jobs", db_path=target).write("x"))
        # SimpleBroker wraps what opening the connection raised in a RuntimeError.
        cause = error.__cause__ if isinstance(error, RuntimeError) else error
        assert isinstance(cause, AccessDenied), (case, repr(error))
        assert expected in str(error), (case, str(error))
        assert took < AT_ONCE, (case, took)
        assert_secret_free(str(error))


def test_the_cli_reports_a_refusal_at_once(auth_server, tmp_path):
    for case, (url, env, expected) in _refusals(auth_server.port).items():
        project = write_project(tmp_path / case, url, "refused")
        start_up = _cli_start_up(auth_server, tmp_path)
        started = time.monotonic()
        result = broker_cli(project, "write", "jobs", "x", env=env)
        took = time.monotonic() - started - start_up
        assert result.returncode != 0 and expected in result.stderr, (case, result.stderr)
        assert took < CLI_AT_ONCE, (case, took)
        assert_secret_free(result.stdout, result.stderr)


@pytest.mark.parametrize("worker", [False, True], ids=["client", "worker"])
def test_taskiq_reports_a_refusal_at_once(auth_server, worker):
    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    url, _, expected = _refusals(auth_server.port)["wrong-password"]

    async def start() -> None:
        broker = SimpleBrokerTaskiqBroker(url, namespace="refused")
        broker.is_worker_process = worker  # a worker waits for a server that is down
        try:
            await broker.startup()
        finally:
            await broker.shutdown()

    error, took = _timed(lambda: asyncio.run(start()))
    assert isinstance(error, AccessDenied) and expected in str(error), repr(error)
    assert took < AT_ONCE, took


def test_a_celery_client_reports_a_refusal_at_once(auth_server):
    """After the publish retries Celery makes on any connection error (about 1 s), as on Redis."""
    from kombu.exceptions import OperationalError as KombuOperationalError

    url, _, expected = _refusals(auth_server.port)["wrong-password"]
    app = _celery_app(f"simplebroker+{url}")
    error, took = _timed(lambda: app.send_task("add", (1, 2)))
    assert isinstance(error, KombuOperationalError) and expected in str(error), repr(error)
    assert took < AT_ONCE, took
    assert_secret_free(str(error))
    app.close()


# -- answers of a server that are not outages ----------------------------------------------


def _taskiq_start(url: str, *, worker: bool) -> Callable[[], None]:
    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    async def start() -> None:
        broker = SimpleBrokerTaskiqBroker(url, namespace="answered")
        broker.is_worker_process = worker  # a worker waits for a server that is down
        try:
            await broker.startup()
        finally:
            await broker.shutdown()

    return lambda: asyncio.run(start())


def _entry_points(url: str) -> dict[str, Callable[[], Any]]:
    target = BrokerTarget("redis", url, {"namespace": "answered"})
    return {
        "queue": lambda: Queue("jobs", db_path=target).write("x"),
        "taskiq client": _taskiq_start(url, worker=False),
        "taskiq worker": _taskiq_start(url, worker=True),
    }


def _all_timed(operations: dict[str, Callable[[], Any]]) -> dict[str, tuple[Any, float]]:
    """Run the operations at once, each in a thread of its own: (error, seconds) of each."""
    with ThreadPoolExecutor(len(operations)) as pool:
        futures = {name: pool.submit(_timed, op) for name, op in operations.items()}
        return {name: future.result(timeout=120) for name, future in futures.items()}


def _refusal(error: BaseException | None) -> BaseException | None:
    # SimpleBroker wraps what opening the connection raised in a RuntimeError.
    return error.__cause__ if isinstance(error, RuntimeError) else error


def test_a_tls_url_on_a_plain_text_port_is_named_a_mismatch_after_one_handshake(server):
    """``rediss://`` on a plain-text port: the handshake waits out the connect timeout
    (the server waits for the rest of what it takes for a command), then the port is
    asked in plain text once, and the mismatch is reported, not retried."""
    url = f"rediss://127.0.0.1:{server.port}/0"
    for name, (error, took) in _all_timed(_entry_points(url)).items():
        refusal = _refusal(error)
        assert isinstance(refusal, AccessDenied), (name, repr(error))
        assert f"TLS mismatch: 127.0.0.1:{server.port} answers in plain text" in str(error), name
        assert "use redis://" in str(error), name
        # One handshake timeout, then at once: retrying would add 2 s, 4 s and two more.
        assert took < CONNECT_TIMEOUT + AT_ONCE, (name, took)


async def _initialize_async(url: str) -> None:
    runner = AsyncRedisRunner(url)
    try:
        await runner.ensure_initialized()
    finally:
        await runner.aclose()


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "asyncio"])
def test_a_tls_port_that_stays_silent_is_not_called_a_mismatch(aio):
    """A handshake that times out on a port that answers nothing, not even a plain
    ``PING``, may be a hung server: the connection's probe finds no plain-text
    reply, so the failure stays a retryable "cannot reach", not ``AccessDenied``."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"rediss://127.0.0.1:{listener.getsockname()[1]}/0?socket_connect_timeout=1"
        if aio:
            error, _ = _timed(lambda: asyncio.run(_initialize_async(url)))
        else:
            runner = RedisRunner(url)
            try:
                error, _ = _timed(runner.ensure_initialized)
            finally:
                runner.shutdown()
    assert error is not None and not isinstance(error, AccessDenied), repr(error)
    assert "cannot reach" in str(error) and "TLS mismatch" not in str(error), str(error)
    assert getattr(error, "retryable", False), repr(error)


def test_a_database_number_out_of_range_is_said_at_once(server, tmp_path, auth_server):
    url = f"redis://127.0.0.1:{server.port}/99"
    for name, (error, took) in _all_timed(_entry_points(url)).items():
        assert isinstance(_refusal(error), Rejected), (name, repr(error))
        assert "DB index is out of range" in str(error) and "use 0-15" in str(error), name
        assert took < AT_ONCE, (name, took)
    project = write_project(tmp_path / "db99", url, "answered")
    start_up = _cli_start_up(auth_server, tmp_path)
    started = time.monotonic()
    result = broker_cli(project, "write", "jobs", "x")
    took = time.monotonic() - started - start_up
    assert result.returncode != 0 and "DB index is out of range" in result.stderr, result
    assert took < CLI_AT_ONCE, took


# -- a server not reachable yet -------------------------------------------------------------


def test_a_server_that_comes_up_during_the_retry_is_reached(tmp_path):
    """SimpleBroker's connection retry still waits for a server that is starting."""
    port = free_port()
    knocked = threading.Event()
    listener = socket.create_server(("127.0.0.1", port))

    def refuse_first_attempt() -> None:
        conn, _ = listener.accept()  # the first attempt: closed unanswered
        conn.close()
        listener.close()
        knocked.set()

    threading.Thread(target=refuse_first_attempt, daemon=True).start()
    target = BrokerTarget("redis", f"redis://127.0.0.1:{port}/0", {"namespace": "late"})
    outcome: list[BaseException | int] = []

    def write() -> None:
        try:
            outcome.append(Queue("jobs", db_path=target).write("x"))
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert knocked.wait(30), "the first connection attempt never came"
    server = DevServer(data_dir=str(tmp_path / "late"), port=port).start()
    try:
        writer.join(30)
        assert outcome and isinstance(outcome[0], int), outcome  # the message ID
        assert Queue("jobs", db_path=target).read() == "x"
    finally:
        server.stop()
