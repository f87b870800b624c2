"""SimpleBroker's own entry points on Redis: Queue, open_broker and the broker CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from simplebroker import BrokerTarget, Queue, QueueStats, open_broker, target_for_directory
from simplebroker.ext import SidecarUnavailableError

from simplebroker_redis import redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import Keyspace
from support.state import stored

BROKER = str(Path(sys.executable).with_name("broker"))


@pytest.fixture
def target(redis_url: str, namespace: str) -> BrokerTarget:
    """The test's namespace as a SimpleBroker target."""
    return BrokerTarget("redis", redis_url, {"namespace": namespace})


@pytest.fixture
def project(tmp_path: Path, redis_url: str, namespace: str) -> Path:
    """A directory whose .broker.toml selects this test's Redis namespace."""
    root = tmp_path / "redis-project"
    root.mkdir()
    (root / ".broker.toml").write_text(
        "version = 1\n"
        'backend = "redis"\n'
        f'target = "{redis_url}"\n'
        "\n[backend_options]\n"
        f'namespace = "{namespace}"\n',
        encoding="utf-8",
    )
    return root


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def broker_cli(cwd: Path, *args: str, stdin: str | None = None, check: bool = True):
    """Run the stock ``broker`` CLI in ``cwd``; return the completed process."""
    done = subprocess.run(
        [BROKER, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


# -- Python API -------------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True], ids=["ephemeral", "persistent"])
def test_queue_on_redis(target, persistent):
    with Queue("jobs", db_path=target, persistent=persistent) as jobs:
        assert jobs.backend_name == "redis"
        first = jobs.write("one")
        second = jobs.write("two")
        third = jobs.write("three")
        assert first < second < third
        assert jobs.last_ts == third
        assert jobs.peek_one() == "one"
        assert jobs.read_one(with_timestamps=True) == ("one", first)
        assert jobs.peek_many(10, with_timestamps=True) == [("two", second), ("three", third)]
        assert jobs.move_one("done", exact_timestamp=third, with_timestamps=True) == (
            "three",
            third,
        )
        assert jobs.stats() == QueueStats("jobs", 1, 1, 2)
        assert jobs.exists() and jobs.has_pending()
        assert jobs.delete(message_id=second) is True
        assert not jobs.has_pending()
        with pytest.raises(SidecarUnavailableError), jobs.sidecar():
            pass
    with Queue("done", db_path=target, persistent=persistent) as done:
        assert done.read_many(5, with_timestamps=True) == [("three", third)]
        assert done.exists()
        assert done.delete() is True
        assert not done.exists()


def test_queues_share_one_high_water_across_handles(target):
    with Queue("a", db_path=target, persistent=True) as a, Queue("b", db_path=target) as b:
        first = a.write("x")
        second = b.write("y")
        assert second > first
        assert a.refresh_last_ts() == second


def test_open_broker_yields_a_redis_core(target, raw, namespace):
    with open_broker(target) as broker:
        assert isinstance(broker, RedisBrokerCore)
        written = broker.write("q", "via open_broker")
    with open_broker(target) as broker:
        assert broker.claim_one("q") == ("via open_broker", written)
    assert stored(raw, namespace)["claimed"] == [f"q {written:019d}"]


def test_project_toml_resolves_to_the_redis_namespace(project, namespace, redis_url):
    resolved = target_for_directory(project)
    assert resolved.backend_name == "redis"
    assert resolved.target == redis_url
    assert resolved.backend_options["namespace"] == namespace
    with Queue("jobs", db_path=resolved) as jobs:
        assert jobs.write("x") > 0


# -- the broker CLI -------------------------------------------------------------------


def test_cli_write_read_peek_list_delete_status(project, raw, namespace):
    broker_cli(project, "write", "jobs", "first")
    broker_cli(project, "write", "jobs", "-", stdin="second")
    broker_cli(project, "write", "other", "x")
    assert broker_cli(project, "list").stdout.split() == ["jobs", "other"]
    peeked = broker_cli(project, "peek", "jobs", "--all", "--json").stdout.splitlines()
    rows = [json.loads(line) for line in peeked]
    assert [row["message"] for row in rows] == ["first", "second"]
    ids = [int(row["timestamp"]) for row in rows]
    assert all(len(row["timestamp"]) == 19 for row in rows)
    assert broker_cli(project, "read", "jobs").stdout == "first\n"
    assert broker_cli(project, "peek", "jobs").stdout == "second\n"
    status = json.loads(broker_cli(project, "--status", "--json").stdout)
    assert status["total_messages"] == 3
    assert int(status["last_timestamp"]) == int(
        raw.hget(Keyspace.for_namespace(namespace).meta, "last_ts")
    )
    broker_cli(project, "delete", "jobs")
    assert broker_cli(project, "list").stdout.split() == ["other"]
    assert broker_cli(project, "read", "jobs", check=False).returncode == 2  # empty queue
    state = stored(raw, namespace)
    assert state["queues"] == ["other"]
    assert f"{ids[1]:019d}" not in state["bodies"]


def test_cli_cleanup_deletes_only_this_namespace(project, raw, namespace, redis_url):
    broker_cli(project, "write", "jobs", "x")
    raw.set("unrelated:key", "keep")
    try:
        done = broker_cli(project, "--cleanup")
        assert "cleaned up" in done.stderr
        assert raw.keys(f"sb:{{{namespace}}}:*") == []
        assert raw.get("unrelated:key") == "keep"
        again = broker_cli(project, "--cleanup")
        assert "nothing to clean up" in again.stderr
        # The namespace is usable again afterwards.
        broker_cli(project, "write", "jobs", "y")
        assert broker_cli(project, "read", "jobs").stdout == "y\n"
    finally:
        raw.delete("unrelated:key")
    assert redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": namespace})


def _seed(broker) -> None:
    broker.write("jobs", "one")
    consumed = broker.write("jobs", "consumed")
    broker.write("jobs", "two\nlines")
    broker.write("gone", "claimed only")
    broker.claim_one("jobs", exact_timestamp=consumed)
    broker.claim_one("gone")
    broker.add_alias("inbox", "jobs")


def _pending(broker) -> dict[str, list[tuple[str, int]]]:
    return {queue: broker.peek_many(queue) for queue in broker.list_queues()}


@pytest.mark.parametrize("direction", ["sqlite-to-redis", "redis-to-sqlite"])
def test_cli_dump_piped_into_load_keeps_ids_and_high_water(project, tmp_path, direction):
    sqlite_dir = tmp_path / "sqlite-project"
    sqlite_dir.mkdir()
    source, dest = (
        (sqlite_dir, project) if direction == "sqlite-to-redis" else (project, sqlite_dir)
    )
    with open_broker(target_for_directory(source)) as broker:
        _seed(broker)
        floor = broker.generate_timestamp()  # high-water above every message
        expected = _pending(broker)
    assert [len(rows) for rows in expected.values()] == [0, 2]  # gone: claimed only
    dump = subprocess.Popen([BROKER, "dump"], cwd=source, stdout=subprocess.PIPE, env=_env())
    assert dump.stdout is not None
    load = subprocess.run(
        [BROKER, "load"], cwd=dest, stdin=dump.stdout, capture_output=True, env=_env()
    )
    dump.stdout.close()
    assert dump.wait(timeout=60) == 0
    assert load.returncode == 0, load.stderr
    with open_broker(target_for_directory(dest)) as broker:
        assert broker.list_queues() == ["jobs"]
        assert broker.peek_many("jobs") == expected["jobs"]  # same bodies, same IDs
        assert broker.list_aliases() == [("inbox", "jobs")]
        assert broker.refresh_last_timestamp() == floor
        assert broker.write("jobs", "after") > floor


def test_cli_dump_header_names_the_redis_backend(project):
    with open_broker(target_for_directory(project)) as broker:
        broker.write("jobs", "x")
    header = json.loads(broker_cli(project, "dump").stdout.splitlines()[0])
    # Informational, read by SimpleBroker from the core's ``_backend_plugin``.
    assert header["backend"] == "redis"
