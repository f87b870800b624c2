"""Passwords never appear in an error, a log record, a repr or the CLI's output.

Whether the server is unreachable, refuses the password, or works; with the
password in the URL or in ``BROKER_BACKEND_PASSWORD``. An error shows
everything it can: ``str``, ``repr`` and the formatted cause chain.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest
from simplebroker import BrokerTarget, Queue
from simplebroker.ext import OperationalError

from simplebroker_redis import (
    AsyncLeases,
    AsyncRedisRunner,
    Leases,
    RedisRunner,
    redis_backend_plugin,
)
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, free_port

from .faulthelpers import QUOTED, SECRET, assert_secret_free, broker_cli, texts_of, write_project


@pytest.fixture
def auth_server(make_server: Callable[..., DevServer]) -> DevServer:
    """A server that requires a password (the real one is SECRET)."""
    return make_server("auth", extra_args=["--requirepass", SECRET])


def _failing_operations(url: str) -> dict[str, Callable[[], Any]]:
    options = {"namespace": "app"}

    async def aio() -> None:
        runner = AsyncRedisRunner(url, namespace="app")
        try:
            await AsyncLeases(runner).reserve("jobs", 1, 30)
        finally:
            await runner.aclose()

    return {
        "runner": lambda: RedisRunner(url, namespace="app").ensure_initialized(),
        "initialize_target": lambda: redis_backend_plugin.initialize_target(
            url, backend_options=options
        ),
        "create_core": lambda: redis_backend_plugin.create_core(url, backend_options=options).write(
            "jobs", "x"
        ),
        "leases": lambda: Leases(RedisRunner(url, namespace="app")),
        "queue": lambda: Queue("jobs", db_path=BrokerTarget("redis", url, options)).write("x"),
        "asyncio": lambda: asyncio.run(aio()),
    }


def _errors_of(operations: dict[str, Callable[[], Any]]) -> dict[str, BaseException | None]:
    """Run every operation at once (SimpleBroker's own connection retries take seconds)."""

    def outcome(operation: Callable[[], Any]) -> BaseException | None:
        try:
            operation()
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            return exc
        return None

    with ThreadPoolExecutor(len(operations)) as pool:
        futures = {name: pool.submit(outcome, op) for name, op in operations.items()}
        return {name: future.result(timeout=60) for name, future in futures.items()}


def _record_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        text += texts_of(record.exc_info[1])
    return text


@pytest.mark.parametrize("where", ["url", "environment"])
@pytest.mark.parametrize("fault", ["unreachable", "wrong-password"])
def test_start_up_failure_is_a_clear_error_without_the_password(
    auth_server, monkeypatch, caplog, fault, where
):
    caplog.set_level(logging.DEBUG)
    port = free_port() if fault == "unreachable" else auth_server.port
    password = SECRET if fault == "unreachable" else "hunter2"  # hunter2 is wrong
    if where == "url":
        url = f"redis://app:{quote(password, safe='')}@127.0.0.1:{port}/0"
    else:
        url = f"redis://127.0.0.1:{port}/0"
        monkeypatch.setenv("BROKER_BACKEND_PASSWORD", password)
    expected = "cannot reach Redis" if fault == "unreachable" else "cannot authenticate"
    operations = _failing_operations(url)
    if where == "environment":
        # SimpleBroker's Queue retries for ~6 s before it fails; the URL runs
        # cover it, and the CLI test covers the environment password with it.
        del operations["queue"]
    for name, error in _errors_of(operations).items():
        # SimpleBroker's Queue wraps the backend's error after its own retries.
        kinds = (OperationalError, RuntimeError) if name == "queue" else OperationalError
        assert isinstance(error, kinds), (name, error)
        assert expected in str(error) and f"127.0.0.1:{port}" in str(error), (name, str(error))
        assert_secret_free(texts_of(error))
    assert_secret_free(caplog.text, *(_record_text(r) for r in caplog.records))


def test_working_password_never_shows_in_reprs_logs_or_thread_names(auth_server, caplog):
    caplog.set_level(logging.DEBUG)
    url = f"redis://:{QUOTED}@127.0.0.1:{auth_server.port}/0"
    runner = RedisRunner(url, namespace="app")
    core = RedisBrokerCore(runner, owns_runner=True)
    core.write("jobs", "x")
    waiter = redis_backend_plugin.create_activity_waiter(
        target=url,
        backend_options={"namespace": "app"},
        queue_name="jobs",
        stop_event=threading.Event(),
    )
    aio = AsyncRedisRunner(url, namespace="app")
    target = BrokerTarget("redis", url, {"namespace": "app"})
    queue = Queue("jobs", db_path=target)
    try:
        shown = [
            repr(runner),
            runner.where,
            repr(core),
            repr(Leases(runner)),
            repr(aio),
            aio.where,
            repr(waiter),
            repr(target),
            repr(queue),
            *(thread.name for thread in threading.enumerate()),
        ]
        assert_secret_free(*shown)
        from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

        broker = SimpleBrokerTaskiqBroker(url, namespace="app")
        assert_secret_free(repr(broker), repr(SimpleBrokerResultBackend(runner=broker.runner)))
    finally:
        waiter.close()
        queue.close()
        core.shutdown()
    assert_secret_free(caplog.text, *(_record_text(r) for r in caplog.records))


def test_cli_errors_never_print_the_password(auth_server, tmp_path):
    cases = {
        "unreachable": (f"redis://app:{QUOTED}@127.0.0.1:{free_port()}/0", {}),
        "wrong-password": (f"redis://:{QUOTED}X@127.0.0.1:{auth_server.port}/0", {}),
        "environment": (auth_server.url, {"BROKER_BACKEND_PASSWORD": SECRET + "X"}),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        results = {
            case: pool.submit(
                broker_cli,
                write_project(tmp_path / case, target, "cli"),
                "write",
                "jobs",
                "x",
                env=env,
            )
            for case, (target, env) in cases.items()
        }
        for case, future in results.items():
            result = future.result()
            assert result.returncode != 0, (case, result)
            assert "Traceback" not in result.stderr, result.stderr
            assert re.search(r"cannot reach|cannot authenticate", result.stderr), result.stderr
            assert_secret_free(result.stdout, result.stderr)


def test_cli_works_with_the_password_from_the_environment(auth_server, tmp_path):
    project = write_project(tmp_path, auth_server.url, "cli")
    env = {"BROKER_BACKEND_PASSWORD": SECRET}
    assert broker_cli(project, "write", "jobs", "hello", env=env).returncode == 0
    read = broker_cli(project, "read", "jobs", env=env)
    assert (read.returncode, read.stdout.strip()) == (0, "hello")
    assert_secret_free(read.stdout, read.stderr)


def test_a_missing_password_says_how_to_give_one(auth_server):
    url = f"redis://127.0.0.1:{auth_server.port}/0"
    for operation in (
        lambda: RedisRunner(url, namespace="app").ensure_initialized(),
        lambda: redis_backend_plugin.create_core(url, backend_options={"namespace": "app"}),
    ):
        with pytest.raises(OperationalError) as caught:
            operation()
        text = str(caught.value)
        assert "requires a password and none was given" in text, text
        assert "BROKER_BACKEND_PASSWORD" in text and "HELLO" not in text
        assert not caught.value.retryable


def test_an_explicit_runner_takes_the_password_from_the_environment(auth_server, monkeypatch):
    monkeypatch.setenv("BROKER_BACKEND_PASSWORD", SECRET)
    runner = RedisRunner(f"redis://127.0.0.1:{auth_server.port}/0", namespace="app")
    core = RedisBrokerCore(runner, owns_runner=True)
    try:
        assert core.write("jobs", "x") > 0
        assert core.claim_one("jobs", with_timestamps=False) == "x"
    finally:
        core.shutdown()
