"""Which server and namespace the Taskiq classes use, and taskiq-redis's constructor names."""

from __future__ import annotations

import ast
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from taskiq.kicker import AsyncKicker
from tqhelpers import PYTHONPATH

import taskiq_simplebroker
from simplebroker_redis import DEFAULT_NAMESPACE
from simplebroker_redis.devserver import DevServer
from taskiq_simplebroker import (
    URL_ENV,
    ConfigurationError,
    SimpleBrokerResultBackend,
    SimpleBrokerScheduleSource,
    SimpleBrokerTaskiqBroker,
)

CLASSES = (SimpleBrokerTaskiqBroker, SimpleBrokerResultBackend, SimpleBrokerScheduleSource)


def write_project(directory: Path, target: str, **options: Any) -> Path:
    """Write a ``.broker.toml`` selecting the redis backend (as README shows)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["version = 1", 'backend = "redis"', f'target = "{target}"', "[backend_options]"]
    lines += [f"{name} = {value!r}".replace("'", '"') for name, value in options.items()]
    path = directory / ".broker.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_result_backend_and_schedule_source_do_not_import_the_broker():
    package = Path(taskiq_simplebroker.__file__).parent
    for name in ("result_backend.py", "schedule_source.py"):
        tree = ast.parse((package / name).read_text())
        imported = {
            (node.level, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        }
        assert (1, "broker") not in imported, name
        assert (1, "connection") in imported, name


def test_server_is_the_url_then_the_environment_then_the_project(tmp_path, monkeypatch):
    toml_target = "redis://127.0.0.1:7001/3"
    write_project(tmp_path, toml_target, namespace="from-toml", max_connections=7)
    below = tmp_path / "src" / "app"
    below.mkdir(parents=True)
    monkeypatch.chdir(below)  # found upward, as the `broker` command finds it
    monkeypatch.delenv(URL_ENV, raising=False)
    for cls in CLASSES:
        made = cls()
        assert made.runner.sync.target == toml_target, cls
        assert made.runner.keys.namespace == "from-toml", cls
        assert made.runner.sync.options.max_connections == 7, cls
    assert SimpleBrokerTaskiqBroker(namespace="mine").runner.keys.namespace == "mine"

    monkeypatch.setenv(URL_ENV, "redis://127.0.0.1:7002/0")
    for cls in CLASSES:
        runner = cls().runner
        assert (runner.sync.target, runner.keys.namespace) == (
            "redis://127.0.0.1:7002/0",
            DEFAULT_NAMESPACE,
        ), cls
    runner = SimpleBrokerTaskiqBroker("redis://127.0.0.1:7003/0").runner
    assert (runner.sync.target, runner.keys.namespace) == (
        "redis://127.0.0.1:7003/0",
        DEFAULT_NAMESPACE,
    )


def test_an_explicit_url_never_reads_the_project_file(tmp_path, monkeypatch):
    (tmp_path / ".broker.toml").write_text("this is [not toml\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(URL_ENV, raising=False)
    for cls in CLASSES:
        assert cls("redis://127.0.0.1:7004/0").runner.keys.namespace == DEFAULT_NAMESPACE
        with pytest.raises(ConfigurationError, match="project config"):
            cls()


def test_a_missing_or_foreign_project_config_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    with pytest.raises(ConfigurationError, match=r"SIMPLEBROKER_REDIS_URL.*\.broker\.toml"):
        SimpleBrokerTaskiqBroker()
    sqlite = tmp_path / "sqlite"
    sqlite.mkdir()
    (sqlite / ".broker.toml").write_text('version = 1\nbackend = "sqlite"\ntarget = "q.db"\n')
    monkeypatch.chdir(sqlite)
    with pytest.raises(ConfigurationError, match=r"'sqlite'.*backend = \"redis\""):
        SimpleBrokerResultBackend()


def test_taskiq_redis_constructor_names(redis_url):
    broker = SimpleBrokerTaskiqBroker(redis_url, queue_name="jobs", max_connection_pool_size=7)
    assert broker.queue == "jobs" and broker.dead_letter_queue == "jobs.dead"
    assert broker.runner.sync.options.max_connections == 7
    backend = SimpleBrokerResultBackend(redis_url=redis_url, max_connection_pool_size=3)
    assert backend.runner.sync.options.max_connections == 3
    source = SimpleBrokerScheduleSource(redis_url, max_connection_pool_size=2)
    assert source.runner.sync.options.max_connections == 2
    assert SimpleBrokerScheduleSource(redis_url).runner.sync.options.max_connections == 10
    conflicts: list[tuple[Any, dict[str, Any], str]] = [
        (SimpleBrokerTaskiqBroker, {"queue": "a", "queue_name": "b"}, "queue or queue_name"),
        (
            SimpleBrokerTaskiqBroker,
            {"max_connections": 5, "max_connection_pool_size": 5},
            "max_connections or max_connection_pool_size",
        ),
        (SimpleBrokerResultBackend, {"redis_url": redis_url}, "url or redis_url"),
        (SimpleBrokerTaskiqBroker, {"decode_responses": False}, "decode_responses.*as text"),
        (SimpleBrokerTaskiqBroker, {"retry_on_timeout": True}, "never retried"),
        (SimpleBrokerResultBackend, {"prefech": 3}, "unknown option 'prefech'"),
        (SimpleBrokerScheduleSource, {"socket_timeout": [1]}, "string, number or bool"),
    ]
    for cls, options, message in conflicts:
        with pytest.raises(ConfigurationError, match=message):
            cls(redis_url, **options)


@pytest.mark.parametrize(
    ("cls", "typo", "nearest"),
    [
        (SimpleBrokerTaskiqBroker, "lease_second", "lease_seconds"),
        (SimpleBrokerTaskiqBroker, "socket_timout", "socket_timeout"),
        (SimpleBrokerResultBackend, "keep_result", "keep_results"),
        (SimpleBrokerScheduleSource, "claim_second", "claim_seconds"),
    ],
)
def test_an_unknown_keyword_names_the_nearest_option_and_lists_both_kinds(
    redis_url, cls, typo, nearest
):
    with pytest.raises(ConfigurationError) as info:
        cls(redis_url, **{typo: 5})
    text = str(info.value)
    assert text.startswith(
        f"{cls.__name__}: unknown option {typo!r}; did you mean {nearest!r}? (its options: "
    ), text
    listed = text.partition("(its options: ")[2]
    ours, _, theirs = listed.partition("; redis-py connection options: ")
    assert "namespace" in ours and "runner" in ours and "socket_timeout" not in ours, text
    assert "socket_timeout" in theirs and "namespace" not in theirs, text
    if cls is SimpleBrokerTaskiqBroker:
        assert all(name in ours for name in ("lease_seconds", "prefetch", "wait_replicas"))


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"namespace": "bad ns!"}, "invalid namespace='bad ns!': expected backend option"),
        ({"max_connections": 0}, "invalid max_connections=0: expected an integer >= 1"),
    ],
)
def test_a_bad_keyword_is_named_as_given_not_as_the_url(redis_url, cls, keywords, message):
    with pytest.raises(ConfigurationError) as info:
        cls(redis_url, **keywords)
    assert str(info.value).startswith(message), str(info.value)


async def test_connection_options_reach_the_server(redis_url, namespace, raw):
    name = f"tq-{uuid.uuid4().hex[:8]}"
    broker = SimpleBrokerTaskiqBroker(
        redis_url, namespace=namespace, client_name=name, socket_keepalive=True
    )
    await broker.startup()
    try:
        assert name in {client["name"] for client in raw.client_list()}
    finally:
        await broker.shutdown()


#: One value per option of URL_OPTIONS that a plain redis:// target takes,
#: and the value redis-py holds after parsing it from the URL.
PLAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "socket_timeout": (7.5, 7.5),
    "socket_connect_timeout": (3, 3.0),
    "socket_keepalive": (True, True),
    "health_check_interval": (15, 15),
    "client_name": ("billing-worker", "billing-worker"),
}

#: ... and the TLS options, for a rediss:// target.
TLS_OPTIONS: dict[str, tuple[Any, Any]] = {
    "ssl_certfile": ("/etc/tls/client.crt", "/etc/tls/client.crt"),
    "ssl_keyfile": ("/etc/tls/client.key", "/etc/tls/client.key"),
    "ssl_ca_certs": ("/etc/tls/ca.pem", "/etc/tls/ca.pem"),
    "ssl_ca_path": ("/etc/tls/cas", "/etc/tls/cas"),
    "ssl_cert_reqs": ("none", "none"),
    "ssl_check_hostname": (False, False),
}


def _pool_options(runner: Any) -> list[dict[str, Any]]:
    """The redis-py connection options of every client kind the runner makes."""
    connections = runner.connections
    clients = [
        connections.async_client(),  # the event loop's command pool
        connections.async_subscriber(),  # wake-ups (listener, dead-letter watch)
        connections.client(),  # the heartbeat thread's pool (runner.sync)
        runner.sync.connections.client(),
    ]
    return [client.connection_pool.connection_kwargs for client in clients]


def test_connection_kwargs_travel_in_the_url_to_every_connection():
    assert set(PLAIN_OPTIONS) | set(TLS_OPTIONS) == taskiq_simplebroker.connection.URL_OPTIONS
    for scheme, options in (("redis", PLAIN_OPTIONS), ("rediss", TLS_OPTIONS)):
        given = {name: value for name, (value, _) in options.items()}
        for cls in CLASSES:
            made = cls(f"{scheme}://127.0.0.1:7005/2", **given)
            for kwargs in _pool_options(made.runner):
                for name, (_, parsed) in options.items():
                    assert kwargs[name] == parsed, (cls, name, kwargs[name])
                assert kwargs["db"] == 2


def test_user_and_password_kwargs_are_encoded_and_never_shown():
    password = "p@ss:w/rd?#%"
    broker = SimpleBrokerTaskiqBroker(
        "redis://127.0.0.1:7006/0", username="app user", password=password
    )
    for kwargs in _pool_options(broker.runner):
        assert (kwargs["username"], kwargs["password"]) == ("app user", password)
    for shown in (repr(broker), broker.runner.where, repr(broker.runner)):
        assert password not in shown and "p%40ss" not in shown
    refused: list[tuple[str, dict[str, Any], str]] = [
        ("redis://someone@127.0.0.1:7006/0", {"password": "x"}, "names a user or password"),
        ("redis://127.0.0.1:7006/0", {"db": 3}, "database number in the URL"),
        ("redis://127.0.0.1:7006/0", {"decode_responses": False}, "as text"),
        ("redis://127.0.0.1:7006/0", {"protocol": 3}, "RESP2"),
        ("redis://127.0.0.1:7006/0", {"ssl_context": object()}, "unknown option .ssl_context."),
    ]
    for url, options, message in refused:
        with pytest.raises(ConfigurationError, match=message):
            SimpleBrokerTaskiqBroker(url, **options)
    shared = SimpleBrokerTaskiqBroker("redis://127.0.0.1:7006/0")
    with pytest.raises(ConfigurationError, match="where the runner is made"):
        SimpleBrokerResultBackend(runner=shared.runner, socket_timeout=3)


async def test_a_worker_uses_the_project_config_and_its_password(tmp_path, children):
    password = "pw-" + uuid.uuid4().hex
    server = DevServer(data_dir=str(tmp_path / "server"), extra_args=["--requirepass", password])
    server.start()
    try:
        project = tmp_path / "project"
        write_project(project, server.url, namespace="from-project")  # no password in it
        (project / "projectapp.py").write_text(
            "from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker\n"
            "broker = SimpleBrokerTaskiqBroker()  # no URL: the project's .broker.toml\n"
            "broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))\n"
            "\n"
            "@broker.task(task_name='projectapp:add')\n"
            "async def add(a: int, b: int) -> int:\n"
            "    return a + b\n"
        )
        env = {key: value for key, value in os.environ.items() if key != URL_ENV}
        env.update(
            BROKER_BACKEND_PASSWORD=password, PYTHONPATH=f"{project}{os.pathsep}{PYTHONPATH}"
        )
        command = [sys.executable, "-m", "taskiq", "worker", "projectapp:broker", "--workers", "1"]
        worker = children.start("worker", command, env, cwd=project)
        producer = SimpleBrokerTaskiqBroker(server.url, namespace="from-project", password=password)
        assert password not in repr(producer) and password not in producer.runner.where
        producer.with_result_backend(SimpleBrokerResultBackend(runner=producer.runner))
        await producer.startup()
        try:
            kicker: AsyncKicker[Any, Any] = AsyncKicker("projectapp:add", producer, {})
            task = await kicker.kiq(20, 22)
            assert (await task.wait_result(check_interval=0.02, timeout=20)).return_value == 42
        finally:
            await producer.shutdown()
            worker.stop()
        assert "Traceback" not in worker.output()
    finally:
        server.stop()
