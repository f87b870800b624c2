"""``taskiq worker`` processes end to end: results, progress, delays, retries, forks."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from taskiq.serializers import PickleSerializer
from tqhelpers import PYTHONPATH, Money, events, kiq

from support.waiting import eventually
from taskiq_simplebroker import ResultIsMissingError, SimpleBrokerResultBackend


@pytest.fixture(params=["uvloop", "asyncio"])
def event_loop_env(request, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The loop a worker runs on: ``taskiq worker`` takes uvloop whenever it imports.

    "asyncio": a module on the worker's path that refuses the import, as on
    a machine without uvloop (the dev extra installs it).
    """
    if request.param == "uvloop":
        return "uvloop", {}
    hidden = tmp_path / "no-uvloop"
    hidden.mkdir()
    (hidden / "uvloop.py").write_text('raise ImportError("not installed here")\n')
    return "asyncio", {"PYTHONPATH": os.pathsep.join([str(hidden), PYTHONPATH])}


async def test_results_progress_retries_and_delays(start_worker, client, task_log, event_loop_env):
    kind, env = event_loop_env
    worker = start_worker(env=env)
    loop = await kiq(client, "loop_kind")
    assert (await loop.wait_result(check_interval=0.02, timeout=15)).return_value.startswith(kind)
    added = await kiq(client, "add", 2, 3)
    assert (await added.wait_result(check_interval=0.02, timeout=15)).return_value == 5

    slow = await kiq(client, "slow", 1.2)
    progress = await eventually(slow.get_progress, timeout=5, interval=0.02)
    assert progress.state == "STARTED" and progress.meta["of"] == 4
    assert not await slow.is_ready()
    assert await eventually(lambda: _step_at_least(slow, 2), timeout=5, interval=0.05)
    assert (await slow.wait_result(check_interval=0.05, timeout=5)).return_value == "slept"

    # Fails twice, retried by SmartRetryMiddleware with a 0.6 s delay label:
    # honoured by the broker itself, no scheduler involved. (Kicked by name,
    # so the labels the task declares are passed here.)
    flaky = await kiq(client, "flaky", "f1", 2, retry_on_error=True, max_retries=3, delay=0.6)
    outcome = await flaky.wait_result(check_interval=0.05, timeout=10)
    assert outcome.return_value == 3 and not outcome.is_err
    attempts = [e.at for e in events(task_log, "attempt")]
    assert len(attempts) == 3
    gaps = [later - earlier for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert min(gaps) >= 0.55, gaps

    started = time.monotonic()
    delayed = await kiq(client, "add", 1, 1, delay=1.0)
    await asyncio.sleep(0.6)
    assert not await delayed.is_ready()
    assert (await delayed.wait_result(check_interval=0.02, timeout=5)).return_value == 2
    assert 0.95 <= time.monotonic() - started < 3.0
    assert worker.stop() == 0
    # redis-py 8 warns in every process that hands an asyncio client a sync Retry.
    assert "UserWarning" not in worker.output(), worker.output()[-3000:]


async def _step_at_least(task, step: int) -> bool:
    progress = await task.get_progress()
    return progress is not None and progress.meta["step"] >= step


async def test_forked_workers_share_the_queue(start_worker, client, task_log):
    # Each process runs two at a time and reserves two ahead, so one process
    # cannot take the whole queue before the other one listens.
    worker = start_worker("--workers", "2", "--max-async-tasks", "2", env={"TQ_PREFETCH": "2"})
    # Both listening first: on a busy machine one process may start seconds
    # after the other, which would otherwise run the whole queue alone.
    await eventually(lambda: worker.output().count("listening on") == 2, timeout=60)
    tasks = [await kiq(client, "record", f"k{i}", 0.05) for i in range(24)]
    for task in tasks:
        await task.wait_result(check_interval=0.02, timeout=20)
    done = events(task_log, "done")
    assert sorted(e.key for e in done) == sorted(f"k{i}" for i in range(24))
    assert len({e.pid for e in done}) == 2, "both forked processes should have worked"
    assert worker.stop() == 0


async def test_expiring_and_one_shot_results_from_a_worker(
    start_worker, client, redis_url, namespace
):
    start_worker(env={"TQ_RESULT_PX": "700"})
    expiring = await kiq(client, "add", 1, 2)
    assert (await expiring.wait_result(check_interval=0.02, timeout=15)).return_value == 3
    await asyncio.sleep(0.9)
    assert not await expiring.is_ready()

    one_shot = SimpleBrokerResultBackend(redis_url, namespace=namespace, keep_results=False)
    task = await kiq(client, "add", 4, 5)
    await eventually(task.is_ready, timeout=10, interval=0.02)
    assert (await one_shot.get_result(task.task_id)).return_value == 9
    try:
        await one_shot.get_result(task.task_id)
    except ResultIsMissingError:
        pass
    else:
        raise AssertionError("a one-shot result was read twice")
    assert not await task.is_ready()
    await one_shot.shutdown()


async def test_pickled_results_concurrency_and_log_level_follow_the_worker(
    start_worker, client, task_log, redis_url, namespace
):
    # An app that configures logging itself (root at WARNING): --log-level
    # still sets this package's level, as it sets Taskiq's own loggers'.
    worker = start_worker(
        "--log-level",
        "INFO",
        "--no-configure-logging",
        env={"TQ_ROOT_LOG_LEVEL": "WARNING", "TQ_RESULTS": "pickle", "TQ_PREFETCH": "4"},
    )
    reader = SimpleBrokerResultBackend(
        redis_url, namespace=namespace, serializer=PickleSerializer()
    )
    client.with_result_backend(reader)
    money = await kiq(client, "value", "money")
    raw = await kiq(client, "value", "bytes")
    assert (await money.wait_result(check_interval=0.02, timeout=15)).return_value == Money(
        12, "EUR"
    )
    assert (await raw.wait_result(check_interval=0.02, timeout=5)).return_value == b"\x00\xffraw"

    # prefetch 4 bounds what is reserved ahead, not what runs: all twelve
    # run at once (taskiq worker --max-async-tasks, default 100).
    tasks = [await kiq(client, "record", f"c{i}", 1.0) for i in range(12)]
    for task in tasks:
        await task.wait_result(check_interval=0.05, timeout=15)
    first_done = min(e.at for e in events(task_log, "done"))
    assert len([e for e in events(task_log, "start") if e.at < first_done]) == 12
    assert worker.stop() == 0
    await reader.shutdown()
    output = worker.output()
    assert "Listening started" in output  # Taskiq's INFO line
    assert "up to 4 task(s) reserved ahead of Taskiq" in output  # ours, at INFO too


async def test_delay_label_with_smart_retry_and_requeue(start_worker, client, task_log):
    start_worker()
    kicked = time.time()
    # SmartRetryMiddleware retries by kicking the task again with a `delay`
    # label; its base delay is the task's own `delay` label when it has one.
    retried = await kiq(client, "fail_once", "r", retry_on_error=True, max_retries=2, delay=0.8)
    # context.requeue() kicks the same message again, labels included.
    kept = await kiq(client, "requeue_once", "kept", True, delay=0.6)
    dropped = await kiq(client, "requeue_once", "dropped", False, delay=0.6)
    for task in (retried, kept, dropped):
        assert not (await task.wait_result(check_interval=0.05, timeout=15)).is_err
    attempts: dict[str, list[float]] = {}
    for e in events(task_log, "attempt"):
        attempts.setdefault(e.key, []).append(e.at)
    assert {key: len(times) for key, times in attempts.items()} == {
        "r": 2,
        "kept": 2,
        "dropped": 2,
    }
    first, retry = attempts["r"]
    assert first - kicked >= 0.75  # the label delays the first run too
    assert retry - first >= 0.75  # ... and is the retry's delay
    assert attempts["kept"][1] - attempts["kept"][0] >= 0.55
    assert attempts["dropped"][1] - attempts["dropped"][0] < 0.5
