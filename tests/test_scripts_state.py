"""Lua scripts run by SHA, survive SCRIPT FLUSH, and leave exactly the expected keys."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import Keyspace
from simplebroker_redis.scripts import SCRIPT_NAMES, function_name, library_name, script_source
from support.state import body_map, members, stored, without_meta

OPERATIONS = {
    "write": lambda b: b.write("q", "x"),
    "write_keep_newest": lambda b: b.write("q", "x", keep_newest=1),
    "insert": lambda b: b.insert_messages([("q", "x", 10**18)]),
    "broadcast": lambda b: b.broadcast("x"),
    "claim_one": lambda b: b.claim_one("q"),
    "claim_many": lambda b: b.claim_many("q", 5),
    "peek_many": lambda b: b.peek_many("q"),
    "move_one": lambda b: b.move_one("q", "dest"),
    "at_least_once": lambda b: list(b.claim_generator("q", delivery_guarantee="at_least_once")),
    "generate_timestamp": lambda b: b.generate_timestamp(),
    "advance_last_timestamp": lambda b: b.advance_last_timestamp(1),
    "delete_ids": lambda b: b.delete_message_ids("q", [1, 2]),
    "delete_queue": lambda b: b.delete("q"),
    "find": lambda b: b.find_message_ids("q", body_contains="seed"),
    "stats": lambda b: b.list_queue_stats(),
    "probe_exists": lambda b: b.queue_exists("q"),
    "probe_pending": lambda b: b.has_pending_messages("q"),
    "probe_latest": lambda b: b.latest_pending_timestamp("q"),
    "rename": lambda b: b.rename_queue("q", "renamed"),
    "alias_add": lambda b: b.add_alias("al", "q"),
    "vacuum": lambda b: b.vacuum(),
}


def _calls(raw, command: str) -> int:
    stats = raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _run_everything(core) -> None:
    core.write("q", "seed")
    core.write("q", "seed 2")
    for operation in OPERATIONS.values():
        operation(core)


@pytest.fixture
def eval_runner(redis_url, namespace):
    runner = RedisRunner(redis_url, namespace=namespace, scripting="eval")
    yield runner
    runner.shutdown()


def _registered_scripts(runner: RedisRunner) -> dict[str, Any]:
    """Register every script with the runner's client (no round trip; EVALSHA on first use)."""
    return {name: runner.client.register_script(script_source(name)) for name in SCRIPT_NAMES}


def test_registered_scripts_are_the_packaged_sources(eval_runner):
    for name, script in _registered_scripts(eval_runner).items():
        assert script.sha == hashlib.sha1(script_source(name).encode()).hexdigest()


def _libraries(raw) -> dict[str, dict[str, list[str]]]:
    """FUNCTION LIST as {library: {function: flags}} (RESP2 replies are flat lists)."""
    out = {}
    for entry in raw.function_list():
        library = dict(zip(entry[::2], entry[1::2], strict=True))
        functions = [dict(zip(f[::2], f[1::2], strict=True)) for f in library["functions"]]
        out[library["library_name"]] = {f["name"]: f["flags"] for f in functions}
    return out


def test_the_library_holds_one_function_per_operation(broker, raw):
    broker.write("q", "seed")  # loads the library on first use
    functions = _libraries(raw)[library_name()]
    assert set(functions) == {function_name(name) for name in SCRIPT_NAMES}
    read_only = {name for name in SCRIPT_NAMES if "no-writes" in functions[function_name(name)]}
    assert read_only == {
        *("peek", "stats", "probe_exists", "probe_pending", "probe_latest", "find"),
        *("dead_letters", "schedule_list"),
        *("depths", "inspect"),
        *("task_find", "running", "task_stats_read"),
    }


def test_every_operation_runs_functions_only(broker, raw):
    before = {name: _calls(raw, name) for name in ("eval", "evalsha", "fcall")}
    _run_everything(broker)
    assert _calls(raw, "eval") == before["eval"]
    assert _calls(raw, "evalsha") == before["evalsha"]
    assert _calls(raw, "fcall") - before["fcall"] >= len(OPERATIONS)


def test_eval_mode_runs_every_operation_by_sha_only(eval_runner, raw):
    core = RedisBrokerCore(eval_runner)
    before = {name: _calls(raw, name) for name in ("eval", "evalsha", "fcall")}
    _run_everything(core)
    assert _calls(raw, "eval") == before["eval"]
    assert _calls(raw, "fcall") == before["fcall"]
    assert _calls(raw, "evalsha") - before["evalsha"] >= len(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_operation_works_after_function_flush(broker, raw, name):
    broker.write("q", "seed")
    broker.write("q", "seed 2")
    raw.function_flush()
    assert library_name() not in _libraries(raw)
    OPERATIONS[name](broker)  # loads the library again, then runs
    assert library_name() in _libraries(raw)
    # Every later operation keeps working too.
    raw.function_flush()
    assert broker.write("after", "flush") > 0
    assert broker.claim_one("after", with_timestamps=False) == "flush"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_eval_mode_operation_works_after_script_flush(eval_runner, raw, name):
    core = RedisBrokerCore(eval_runner)
    core.write("q", "seed")
    core.write("q", "seed 2")
    raw.script_flush()
    assert not any(raw.script_exists(_registered_scripts(eval_runner)["write"].sha))
    eval_before = _calls(raw, "eval")
    OPERATIONS[name](core)
    assert _calls(raw, "eval") == eval_before  # reloaded with SCRIPT LOAD, run by SHA
    raw.script_flush()
    assert core.write("after", "flush") > 0
    assert core.claim_one("after", with_timestamps=False) == "flush"


def test_a_fresh_core_works_after_function_flush(redis_url, namespace, raw):
    raw.function_flush()
    core = redis_backend_plugin.create_core(redis_url, backend_options={"namespace": namespace})
    written = core.write("q", "x")
    assert core.claim_one("q") == ("x", written)


# -- exact stored state ----------------------------------------------------------------


def test_write_and_claim_states(broker, raw, namespace):
    first = broker.write("q", "one")
    second = broker.write("q", "two")
    assert stored(raw, namespace) == {
        "meta": {
            "magic": "simplebroker-redis",
            "schema_version": "1",
            "last_ts": f"{second:019d}",
            "alias_version": "0",
        },
        "queues": ["q"],
        "pending": members("q", first, second),
        "bodies": body_map({first: "one", second: "two"}),
    }
    broker.claim_one("q")
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["q"],
        "pending": members("q", second),
        "claimed": members("q", first),
        "bodies": body_map({first: "one", second: "two"}),
    }
    broker.claim_one("q")
    broker.vacuum()
    assert without_meta(stored(raw, namespace)) == {}


def test_delete_states(broker, raw, namespace):
    keep = broker.write("keep", "k")
    gone = [broker.write("q", f"m{i}") for i in range(3)]
    broker.claim_one("q")
    assert broker.delete_message_ids("q", [gone[0], gone[2]]) == 2
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["keep", "q"],
        "pending": members("keep", keep) + members("q", gone[1]),
        "bodies": body_map({keep: "k", gone[1]: "m1"}),
    }
    broker.delete("q")
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["keep"],
        "pending": members("keep", keep),
        "bodies": body_map({keep: "k"}),
    }
    broker.delete()
    assert without_meta(stored(raw, namespace)) == {}


def test_at_least_once_batches_leave_no_reservation_records(broker, raw, namespace):
    ids = [broker.write("q", f"m{i}") for i in range(4)]
    gen = broker.claim_generator("q", delivery_guarantee="at_least_once", batch_size=3)
    next(gen)
    reserved = stored(raw, namespace)
    assert reserved["reserved"] == members("q", *ids[:3])
    assert reserved["pending"] == members("q", ids[3])
    assert set(reserved["owners"]) == {f"{i:019d}" for i in ids[:3]}
    gen.close()  # released: pending again, reservation records gone
    released = stored(raw, namespace)
    assert released["pending"] == members("q", *ids)
    for name in ("reserved", "owners", "tokens", "token_ids", "leases"):
        assert name not in released
    assert len(list(broker.claim_generator("q", delivery_guarantee="at_least_once"))) == 4
    broker.vacuum()
    assert without_meta(stored(raw, namespace)) == {}


def test_namespaces_are_isolated(redis_url, namespace, raw):
    other_ns = f"{namespace}-other"
    mine = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), owns_runner=True)
    theirs = RedisBrokerCore(RedisRunner(redis_url, namespace=other_ns), owns_runner=True)
    try:
        mine.write("q", "mine")
        theirs.write("q", "theirs")
        theirs.add_alias("al", "q")
        assert mine.peek_many("q", with_timestamps=False) == ["mine"]
        assert mine.list_aliases() == []
        assert mine.claim_one("q", with_timestamps=False) == "mine"
        assert theirs.peek_many("q", with_timestamps=False) == ["theirs"]
        redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": other_ns})
        assert raw.keys(f"sb:{{{other_ns}}}:*") == []
        assert raw.exists(Keyspace.for_namespace(namespace).meta) == 1
    finally:
        theirs.shutdown()
        mine.shutdown()
        redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": other_ns})
