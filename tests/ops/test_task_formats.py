"""Each integration's task format: its bodies and results read back, and its producer's index key.

The formats are found through their entry points, as the dashboard finds
them; the bodies are what each framework's producer really stores.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from taskiq.kicker import AsyncKicker

from simplebroker_redis import AsyncRedisRunner, RedisRunner, calls
from simplebroker_redis.calls import celery as celery_calls
from simplebroker_redis.ops.dashboard.live import read_state
from simplebroker_redis.ops.dashboard.tasks import Reader
from simplebroker_redis.queue_names import storage_queue
from simplebroker_redis.tasks import TaskFormat, describe, task_formats
from taskiq_simplebroker import SimpleBrokerTaskiqBroker


def formats() -> dict[str, TaskFormat]:
    return {fmt.framework: fmt for fmt in task_formats()}


def test_every_integration_registers_its_format() -> None:
    assert set(formats()) == {"taskiq", "celery", "protean", "dramatiq"}


def test_a_taskiq_message_and_its_results_read_back(runner: RedisRunner) -> None:
    async def send() -> str:
        broker = SimpleBrokerTaskiqBroker(
            url=runner.target, namespace=runner.keys.namespace, queue="q"
        )
        await broker.startup()
        try:
            kicker = AsyncKicker(task_name="app.add", broker=broker, labels={"x": "1"})
            return str((await kicker.kiq(1, 2, big="y" * 50_000)).task_id)
        finally:
            await broker.shutdown()

    task_id = asyncio.run(send())
    [body] = [b for b, _ in runner.run(calls.peek("q", limit=10))]
    info = describe(body)
    assert info is not None
    assert (info.framework, info.task_id, info.name) == ("taskiq", task_id, "app.add")
    assert info.preview.startswith('{"args": [1, 2]') and len(info.preview) <= 300
    # A body cut short (the dashboard reads at most 16 KB of each) still names its task.
    cut = describe(body[:200])
    assert cut is not None and (cut.task_id, cut.name) == (task_id, "app.add")
    found = runner.run(calls.task_find([f"taskiq:{task_id}"])).found
    assert [location.body for location in found] == [body[: len(found[0].body)]]
    taskiq = formats()["taskiq"]
    ok = taskiq.outcome(json.dumps({"is_err": False, "return_value": 3, "execution_time": 0.1}))
    assert ok is not None and (ok.state, ok.result) == ("SUCCESS", "3")
    error = {"exc_type": "ValueError", "exc_message": ["boom"], "exc_module": "builtins"}
    bad = taskiq.outcome(json.dumps({"is_err": True, "return_value": None, "error": error}))
    assert bad is not None and (bad.state, bad.error) == ("FAILURE", "ValueError: boom")
    assert taskiq.result_keys(runner.keys, task_id) == (runner.keys.result_key(task_id),)


def test_a_celery_message_and_its_results_read_back(runner: RedisRunner) -> None:
    from celery import Celery

    import celery_simplebroker  # noqa: F401 - registers the transport

    app = Celery("formats")
    app.conf.update(
        broker_url=f"simplebroker+{runner.target}",
        broker_transport_options={"namespace": runner.keys.namespace},
    )
    try:
        sent = app.send_task("app.mul", (6, 7), queue="celery")
    finally:
        app.close()
    [body] = [b for b, _ in runner.run(calls.peek("celery", limit=10))]
    info = describe(body)
    assert info is not None
    assert (info.framework, info.task_id, info.name) == ("celery", sent.id, "app.mul")
    assert info.origin == "celery" and "(6, 7)" in info.preview
    assert [f.id for f in runner.run(calls.task_find([f"celery:{sent.id}"])).found]
    celery = formats()["celery"]
    ok = celery.outcome(json.dumps({"status": "SUCCESS", "result": 42, "traceback": None}))
    assert ok is not None and (ok.state, ok.result) == ("SUCCESS", "42")
    meta: dict[str, Any] = {
        "status": "FAILURE",
        "result": {"exc_type": "KeyError", "exc_message": ["k"], "exc_module": "builtins"},
        "traceback": "Traceback (most recent call last): ...",
    }
    bad = celery.outcome(json.dumps(meta))
    assert bad is not None and (bad.state, bad.error) == ("FAILURE", "KeyError: k")
    assert bad.traceback.startswith("Traceback")
    key = celery_calls.entry_key(runner.keys, f"celery-task-meta-{sent.id}")
    assert celery.result_keys(runner.keys, sent.id) == (key,)


def test_protean_log_entries_and_group_copies_read_back() -> None:
    message = {
        "data": {"tag": "t"},
        "metadata": {"headers": {"id": "ops::report-1-0.1", "type": "Ops.ReportRequested.v1"}},
    }
    log_entry = json.dumps(message)
    copy = f'{{"id":"1796000000000000000","message":{log_entry}}}'
    info = describe(log_entry)
    assert info is not None and (info.framework, info.task_id) == ("protean", None)
    assert info.name == "Ops.ReportRequested.v1"
    info = describe(copy)
    assert info is not None and info.task_id == "1796000000000000000"
    protean = formats()["protean"]
    queues = ["p.s", "p.s--g", "p.s--g--at", "p.s--h--at", "p.other--k--at"]
    lookups = protean.lookups("1796000000000000000", queues)
    assert set(lookups.keys) == {
        "protean:1796000000000000000",
        "protean:p.s--g:1796000000000000000",
        "protean:p.s--h:1796000000000000000",
        "protean:p.other--k:1796000000000000000",
    }
    assert set(lookups.messages) == {("p.s", 1796000000000000000), ("p.other", 1796000000000000000)}
    assert list(protean.consumers("p.s", queues)) == [
        ("p.s--g", "p.s--g--at"),
        ("p.s--h", "p.s--h--at"),
    ]
    assert protean.progress_of('{"at":"1796000000000000001"}') == 1796000000000000001
    assert protean.source_queue("p.s--g--dead") == "p.s--g"


def find_on_dashboard(runner: RedisRunner, query: str) -> list[dict[str, Any]]:
    """Return the tasks the dashboard's search finds for ``query``."""

    async def search() -> list[dict[str, Any]]:
        arunner = AsyncRedisRunner(runner.target, runner.options)
        try:
            reader = Reader(arunner, await read_state(arunner))
            return list((await reader.find(query))["tasks"])
        finally:
            await arunner.aclose()

    return asyncio.run(search())


def test_a_dramatiq_message_and_its_results_read_back(runner: RedisRunner) -> None:
    import dramatiq

    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend

    broker = SimpleBrokerDramatiqBroker(runner.target, namespace=runner.keys.namespace)
    backend = SimpleBrokerResultBackend(broker=broker)

    def add(*args: Any, **kwargs: Any) -> None:
        return None

    actor = dramatiq.actor(add, broker=broker, actor_name="app.add", queue_name="dq")
    try:
        sent = actor.send(1, 2, big="y" * 50_000)
        [body] = [b for b, _ in runner.run(calls.peek("dq", limit=10))]
        info = describe(body)
        assert info is not None
        assert (info.framework, info.task_id, info.name) == ("dramatiq", sent.message_id, "app.add")
        assert info.preview.startswith('{"args": [1, 2]') and len(info.preview) <= 300
        assert info.origin == "dq"
        # Cut short, it still names its actor (its ID comes after the long arguments).
        cut = describe(body[:200])
        assert cut is not None and (cut.name, cut.task_id, cut.origin) == ("app.add", None, "dq")
        short = actor.send(3)
        cut = describe(short.encode().decode()[:-5])  # the ID comes before the timestamp
        assert cut is not None and (cut.name, cut.task_id) == ("app.add", short.message_id)
        found = runner.run(calls.task_find([f"dramatiq:{sent.message_id}"])).found
        assert [location.id for location in found] and found[0].state == "pending"

        # Results: found from the message ID through the key stored beside each.
        dramatiq_format = formats()["dramatiq"]
        backend.store_result(sent, {"sum": 3}, 60_000)
        backend.store_exception(short, ValueError("boom"), 60_000)
        for message, state, text in (
            (sent, "SUCCESS", '{"sum": 3}'),
            (short, "FAILURE", "ValueError: boom"),
        ):
            keys = dramatiq_format.result_keys(runner.keys, message.message_id)
            [pointer] = runner.run(calls.task_find(result_keys=keys)).results
            key = dramatiq_format.follow(runner.keys, pointer)
            assert key is not None
            [value] = runner.run(calls.task_find(result_keys=[key])).results
            outcome = dramatiq_format.outcome(value)
            assert outcome is not None and outcome.state == state
            assert text in (outcome.result if state == "SUCCESS" else outcome.error)
        # The dashboard's search: pending with its stored result, then done once it is gone.
        [item] = find_on_dashboard(runner, sent.message_id)
        assert (item["framework"], item["state"]) == ("dramatiq", "pending")
        assert item["name"] == "app.add"
        assert item["result"]["state"] == "SUCCESS"
        broker.flush("dq")
        [item] = find_on_dashboard(runner, sent.message_id)
        assert (item["state"], item["result"]["result"]) == ("done", '{"sum": 3}')
        [item] = find_on_dashboard(runner, short.message_id)
        assert (item["state"], item["result"]["error"]) == ("failed", "ValueError: boom")
        # A nacked message's queue is the one it came from (a retry's target).
        assert dramatiq_format.source_queue("dq.XQ") == "dq"
        assert dramatiq_format.source_queue(storage_queue("my:q.XQ")) == storage_queue("my:q")
        assert dramatiq_format.source_queue("dq.dead") is None
    finally:
        broker.close()


def test_a_dramatiq_broker_without_the_index_writes_no_index_entries(runner: RedisRunner) -> None:
    import dramatiq

    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend
    from dramatiq_simplebroker.taskstats import TaskStatsMiddleware

    broker = SimpleBrokerDramatiqBroker(
        runner.target, namespace=runner.keys.namespace, task_index=False, task_stats=False
    )
    backend = SimpleBrokerResultBackend(broker=broker)

    def nothing() -> None:
        return None

    actor = dramatiq.actor(nothing, broker=broker, actor_name="app.nothing", queue_name="dq")
    try:
        sent = actor.send()
        backend.store_result(sent, 1, 60_000)
        assert backend.get_result(sent) == 1
        assert runner.run(calls.task_find([f"dramatiq:{sent.message_id}"])).found == ()
        pointer = formats()["dramatiq"].result_keys(runner.keys, sent.message_id)
        assert runner.run(calls.task_find(result_keys=pointer)).results == ("",)
        assert find_on_dashboard(runner, sent.message_id) == []
        assert broker.task_stats is None
        assert not [m for m in broker.middleware if isinstance(m, TaskStatsMiddleware)]
    finally:
        broker.close()


def test_bodies_no_framework_wrote_are_nobodys() -> None:
    for body in ("hello", '{"a": 1}', "\x00b:AAEC", '{"headers": {"x": 1}}', ""):
        assert describe(body) is None, body
