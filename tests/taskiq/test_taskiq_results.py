"""The result backend: storage, expiry, one-shot reads, serializers, ack modes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from simplebroker.ext import BrokerError
from taskiq import TaskiqMiddleware, TaskiqResult
from taskiq.acks import AcknowledgeType
from taskiq.depends.progress_tracker import TaskProgress, TaskState
from taskiq.exceptions import ResultGetError
from taskiq.serializers import PickleSerializer
from tqhelpers import kiq, make_broker, receiving

from taskiq_simplebroker import (
    ConfigurationError,
    ResultIsMissingError,
    SimpleBrokerResultBackend,
)


def result(value: Any, *, error: BaseException | None = None) -> TaskiqResult[Any]:
    return TaskiqResult(
        is_err=error is not None, return_value=value, execution_time=0.1, error=error
    )


@pytest.fixture
async def backend(redis_url, namespace):
    made: list[SimpleBrokerResultBackend[Any]] = []

    def make(**options: Any) -> SimpleBrokerResultBackend[Any]:
        made.append(SimpleBrokerResultBackend(redis_url, namespace=namespace, **options))
        return made[-1]

    yield make
    for backend in made:
        await backend.shutdown()


async def test_results_and_progress_live_in_the_namespace(backend, namespace, raw):
    store = backend()
    assert not await store.is_result_ready("t1")
    assert await store.get_progress("t1") is None
    await store.set_progress("t1", TaskProgress(state=TaskState.STARTED, meta={"done": 1}))
    await store.set_result("t1", result({"sum": 3}))
    assert await store.is_result_ready("t1")
    got = await store.get_result("t1")
    assert got.return_value == {"sum": 3} and not got.is_err
    assert (await store.get_progress("t1")).meta == {"done": 1}
    assert raw.exists(f"sb:{{{namespace}}}:result:t1", f"sb:{{{namespace}}}:progress:t1") == 2
    assert raw.ttl(f"sb:{{{namespace}}}:result:t1") == -1  # no expiry asked: kept
    assert raw.get(f"sb:{{{namespace}}}:result:t1").startswith("{")  # readable JSON


async def test_errors_round_trip(backend):
    store = backend()
    await store.set_result("t2", result(None, error=ValueError("boom")))
    got = await store.get_result("t2")
    assert got.is_err and isinstance(got.error, ValueError) and str(got.error) == "boom"


async def test_missing_result_is_a_taskiq_and_a_simplebroker_error(backend):
    with pytest.raises(ResultIsMissingError) as info:
        await backend().get_result("never")
    assert isinstance(info.value, ResultGetError) and isinstance(info.value, BrokerError)


@pytest.mark.parametrize(
    ("options", "ttl_ms"), [({"result_px_time": 300}, 300), ({"result_ex_time": 1}, 1000)]
)
async def test_expiry_applies_to_results_and_progress(backend, namespace, raw, options, ttl_ms):
    store = backend(**options)
    await store.set_result("t3", result(1))
    await store.set_progress("t3", TaskProgress(state=TaskState.STARTED, meta=None))
    for kind in ("result", "progress"):
        assert 0 < raw.pttl(f"sb:{{{namespace}}}:{kind}:t3") <= ttl_ms
    await asyncio.sleep(ttl_ms / 1000 + 0.1)
    assert not await store.is_result_ready("t3")
    assert await store.get_progress("t3") is None


@pytest.mark.parametrize(
    "options",
    [
        {"result_ex_time": 1, "result_px_time": 1000},
        {"result_ex_time": 0},
        {"result_px_time": -5},
        {"result_ex_time": 1.5},
    ],
)
def test_expiry_options_are_validated(redis_url, options):
    with pytest.raises(ConfigurationError):
        SimpleBrokerResultBackend(redis_url, **options)


async def test_one_shot_results_are_consumed_atomically(backend, namespace, raw):
    store = backend(keep_results=False)
    await store.set_progress("t4", TaskProgress(state=TaskState.SUCCESS, meta=None))
    await store.set_result("t4", result(42))
    readers = [backend(keep_results=False) for _ in range(8)]
    outcomes = await asyncio.gather(
        *(reader.get_result("t4") for reader in readers), return_exceptions=True
    )
    values = [o.return_value for o in outcomes if isinstance(o, TaskiqResult)]
    assert values == [42], outcomes
    misses = [o for o in outcomes if not isinstance(o, TaskiqResult)]
    assert len(misses) == 7 and all(isinstance(o, ResultIsMissingError) for o in misses)
    assert raw.exists(f"sb:{{{namespace}}}:result:t4", f"sb:{{{namespace}}}:progress:t4") == 0


async def test_custom_serializer_is_stored_losslessly(backend, namespace, raw):
    store = backend(serializer=PickleSerializer())
    await store.set_result("t5", result([1, "two"]))
    assert raw.get(f"sb:{{{namespace}}}:result:t5").startswith("\x00b:")
    assert (await store.get_result("t5")).return_value == [1, "two"]
    await store.set_progress("t5", TaskProgress(state="half", meta=0.5))
    assert (await store.get_progress("t5")).meta == 0.5


class ReadBack(TaskiqMiddleware):
    """Reads each saved result back in the worker, before the message is acked."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    async def post_save(self, message: Any, result: TaskiqResult[Any]) -> None:
        stored = await self.broker.result_backend.get_result(message.task_id)
        self.seen[message.task_id] = stored.return_value


@pytest.mark.parametrize("ack_type", list(AcknowledgeType))
async def test_results_are_saved_and_readable_in_every_ack_mode(
    client, redis_url, namespace, broker, ack_type
):
    worker = make_broker(redis_url, namespace)
    reader = ReadBack()
    worker.add_middlewares(reader)
    worker.register_task(lambda a, b: a + b, task_name="workerapp:add")
    async with receiving(worker, ack_type=ack_type):
        tasks = [await kiq(client, "add", i, 10) for i in range(5)]
        for i, task in enumerate(tasks):
            got = await task.wait_result(check_interval=0.01, timeout=5)
            assert got.return_value == i + 10
    assert reader.seen == {task.task_id: i + 10 for i, task in enumerate(tasks)}
    left = broker.peek_many("taskiq", 10)
    # MANUAL: the tasks never acknowledged, so shutdown handed them back.
    assert len(left) == (5 if ack_type == AcknowledgeType.MANUAL else 0)
