"""Plugin resolution, options, targets and namespace lifecycle."""

from __future__ import annotations

import pytest
import simplebroker.ext as ext
from simplebroker.ext import DatabaseError, DataError, InvalidConfigError, OperationalError

from simplebroker_redis import RedisRunner, get_backend_plugin, redis_backend_plugin
from simplebroker_redis.keys import Keyspace
from simplebroker_redis.options import BackendOptions
from simplebroker_redis.runner import shared_runner
from simplebroker_redis.targets import redact_target


def test_entry_point_resolves_with_exact_handshake():
    plugin = ext.get_backend_plugin("redis")
    assert plugin is redis_backend_plugin is get_backend_plugin()
    assert plugin.backend_api_version == ext.BACKEND_API_VERSION == 9
    assert plugin.sql is None and plugin.is_direct_backend is True


def test_options_defaults_and_round_trip():
    opts = BackendOptions.parse(None)
    assert opts.namespace == "simplebroker_redis_v1"
    assert opts.max_connections == 50
    assert opts.pool_timeout is None
    assert opts.stale_batch_seconds == 300.0
    assert BackendOptions.parse(opts.to_dict()) == opts


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"nope": 1}, "nope"),
        ({"namespace": 3}, "namespace"),
        ({"namespace": "has space"}, "namespace"),
        ({"namespace": "a{b}"}, "namespace"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": True}, "max_connections"),
        ({"max_connections": 2.5}, "max_connections"),
        ({"pool_timeout": "5"}, "pool_timeout"),
        ({"pool_timeout": -1}, "pool_timeout"),
        ({"stale_batch_seconds": float("nan")}, "stale_batch_seconds"),
        ({"stale_batch_seconds": None}, "stale_batch_seconds"),
    ],
)
def test_bad_options_name_the_option(options, name):
    with pytest.raises(InvalidConfigError) as info:
        BackendOptions.parse(options)
    assert f"backend_options.{name}" in str(info.value)
    assert info.value.key == f"backend_options.{name}"


def test_init_backend_requires_a_target_and_validates_scheme():
    plugin = redis_backend_plugin
    with pytest.raises(ValueError, match="needs a target"):
        plugin.init_backend({"BACKEND_TARGET": ""})
    with pytest.raises(ValueError, match="redis://"):
        plugin.init_backend({}, toml_target="http://host/0")
    resolved = plugin.init_backend({}, toml_target="redis://h:1/2", toml_options={"namespace": "x"})
    assert resolved["target"] == "redis://h:1/2"
    assert resolved["backend_options"]["namespace"] == "x"
    again = plugin.init_backend(
        {}, toml_target=resolved["target"], toml_options=resolved["backend_options"]
    )
    assert again == resolved


def test_redaction_hides_passwords():
    assert redact_target("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_target("rediss://:s3cret@host/1") == "rediss://:***@host/1"
    assert "s3cret" not in redact_target("redis://:s3cret@[bad")
    runner = RedisRunner("redis://:s3cret@127.0.0.1:1/0", namespace="n")
    assert "s3cret" not in repr(runner)
    assert "s3cret" not in runner.where


def test_unreachable_server_is_operational_error_without_password():
    runner = RedisRunner("redis://:hunter2@127.0.0.1:1/0", namespace="unreach", pool_timeout=1)
    with pytest.raises(OperationalError) as info:
        runner.ensure_initialized()
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)
    runner.shutdown()


def test_keyspace_shares_one_hash_tag():
    keys = Keyspace.for_namespace("app.prod")
    for key in keys.fixed_keys:
        assert key.startswith("sb:{app.prod}:")
    assert keys.result_key("abc") == "sb:{app.prod}:result:abc"
    assert keys.wake_channel("jobs") == "sb:{app.prod}:wake:jobs"


def test_initialize_validate_cleanup_cycle(redis_url, namespace, raw):
    plugin = redis_backend_plugin
    opts = {"namespace": namespace}
    with pytest.raises(DatabaseError):
        plugin.validate_target(redis_url, backend_options=opts)
    plugin.validate_target(redis_url, backend_options=opts, verify_initialized=False)
    plugin.initialize_target(redis_url, backend_options=opts)
    plugin.initialize_target(redis_url, backend_options=opts)  # idempotent
    plugin.validate_target(redis_url, backend_options=opts)
    meta = raw.hgetall(f"sb:{{{namespace}}}:meta")
    assert meta["magic"] == "simplebroker-redis" and meta["schema_version"] == "1"
    raw.set("unrelated:key", "keep me")
    core = plugin.create_core(redis_url, backend_options=opts)
    core.write("q", "x")
    assert plugin.cleanup_target(redis_url, backend_options=opts) is True
    assert raw.keys(f"sb:{{{namespace}}}:*") == []
    assert raw.get("unrelated:key") == "keep me"
    assert plugin.cleanup_target(redis_url, backend_options=opts) is False
    raw.delete("unrelated:key")


def test_validate_refuses_foreign_and_wrong_typed_keys(redis_url, namespace, raw):
    plugin = redis_backend_plugin
    opts = {"namespace": namespace}
    raw.set(f"sb:{{{namespace}}}:pending", "not a zset")
    with pytest.raises(DatabaseError, match="no meta"):
        plugin.validate_target(redis_url, backend_options=opts)
    with pytest.raises(DatabaseError):
        plugin.initialize_target(redis_url, backend_options=opts)
    raw.delete(f"sb:{{{namespace}}}:pending")
    plugin.initialize_target(redis_url, backend_options=opts)
    raw.set(f"sb:{{{namespace}}}:bodies", "wrong type")
    # A damaged key is reported by the operation that meets it, at once, not by
    # validate_target (SimpleBroker's connection loop would retry that for seconds).
    plugin.validate_target(redis_url, backend_options=opts)
    core = plugin.create_core(redis_url, backend_options=opts)
    with pytest.raises(DataError, match="bodies holds a string, expected a hash"):
        core.write("q", "x")
    raw.delete(f"sb:{{{namespace}}}:bodies")
    raw.hset(f"sb:{{{namespace}}}:meta", "magic", "something-else")
    # This process validated the namespace already, so validate_target does
    # not ask again (a project Queue calls it before every operation); the
    # next writing script refuses the foreign meta itself...
    with pytest.raises(DatabaseError, match="magic is something-else"):
        core.write("q", "x")
    # ... and a process that has not seen the namespace yet refuses it up front.
    shared_runner(redis_url, BackendOptions.parse(opts), None).mark_initialized(False)
    with pytest.raises(DatabaseError):
        plugin.validate_target(redis_url, backend_options=opts)
    with pytest.raises(DatabaseError):
        plugin.cleanup_target(redis_url, backend_options=opts)
    assert raw.exists(f"sb:{{{namespace}}}:meta")
    raw.delete(f"sb:{{{namespace}}}:meta")


def test_an_explicit_runner_ignores_a_broken_project_file(
    redis_url, namespace, tmp_path, monkeypatch, raw
):
    from simplebroker import Queue

    # A .broker.toml that would fail if it were read: wrong server, wrong credentials.
    (tmp_path / ".broker.toml").write_text(
        'version = 1\nbackend = "redis"\ntarget = "redis://nobody:wrong@127.0.0.1:1/0"\n\n'
        '[backend_options]\nnamespace = "not-this-one"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    runner = RedisRunner(redis_url, namespace=namespace)
    try:
        with Queue("jobs", db_path=runner.broker_target, runner=runner, persistent=True) as queue:
            queue.write("hello")
            assert queue.read() == "hello"
        assert raw.exists(f"sb:{{{namespace}}}:meta")
        assert not raw.exists("sb:{not-this-one}:meta")
    finally:
        runner.shutdown()


@pytest.mark.parametrize("opened", ["project", "project-persistent", "runner"])
def test_damage_surfaces_from_the_operation_at_once(
    redis_url, namespace, tmp_path, monkeypatch, raw, opened
):
    import time

    from simplebroker import Queue

    (tmp_path / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{redis_url}"\n\n'
        f'[backend_options]\nnamespace = "{namespace}"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    runner = RedisRunner(redis_url, namespace=namespace)
    try:
        if opened == "runner":
            queue = Queue("jobs", db_path=runner.broker_target, runner=runner, persistent=True)
        else:
            queue = Queue("jobs", persistent=opened == "project-persistent")
        queue.write("before")  # the namespace exists and works
        pending = f"sb:{{{namespace}}}:pending"
        raw.delete(pending)
        raw.set(pending, "planted after the namespace was created")
        started = time.monotonic()
        with pytest.raises(DataError, match="pending holds a string, expected a zset"):
            queue.write("after")
        assert time.monotonic() - started < 2, "the damage was retried as a connection error"
        assert raw.get(pending) == "planted after the namespace was created"
        queue.close()
    finally:
        raw.delete(f"sb:{{{namespace}}}:pending")
        runner.shutdown()
