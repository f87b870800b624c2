"""The size limit of a task: ``BROKER_MAX_MESSAGE_SIZE``, and ``kiq()`` saying why it refused one.

The limit is the one every entry point applies (the ``broker`` command,
Celery publishes, Protean): SimpleBroker's setting from the environment,
10 MB by default.
"""

from __future__ import annotations

from typing import Any

import pytest
from simplebroker import resolve_config
from simplebroker.ext import MessageError
from taskiq import TaskiqMessage, TaskiqMiddleware
from taskiq.exceptions import SendTaskError
from tqhelpers import kiq, make_broker

from taskiq_simplebroker import MessageTooLargeError

#: SimpleBroker's default limit, which the docs state as 10 MB.
DEFAULT_LIMIT = int(resolve_config()["MAX_MESSAGE_SIZE"])


def stored(core: Any, queue: str = "taskiq") -> list[str]:
    return [body for body, _ in core.peek_many(queue, 100)]


def test_the_documented_default_is_10_mb() -> None:
    assert DEFAULT_LIMIT == 10 * 1024 * 1024


async def test_the_limit_comes_from_the_environment_and_an_oversize_task_says_why(
    redis_url, namespace, broker, monkeypatch
):
    monkeypatch.setenv("BROKER_MAX_MESSAGE_SIZE", "2000")
    small = make_broker(redis_url, namespace)
    await small.startup()
    try:
        with pytest.raises(MessageTooLargeError) as info:
            await kiq(small, "add", "x" * 3000, 1)
        refused, text = info.value, str(info.value)
        # The reason and the setting in the error itself, not in a hidden cause.
        assert "'workerapp:add'" in text and "more than BROKER_MAX_MESSAGE_SIZE (2000 bytes" in text
        assert isinstance(refused, SendTaskError) and isinstance(refused, MessageError)
        assert stored(broker) == []  # nothing was sent
        await kiq(small, "add", "x" * 1000, 1)  # under the limit
        assert len(stored(broker)) == 1
    finally:
        await small.shutdown()

    # Raised above the default: a task of more than 10 MB goes through.
    monkeypatch.setenv("BROKER_MAX_MESSAGE_SIZE", str(DEFAULT_LIMIT + 1_000_000))
    large = make_broker(redis_url, namespace)
    await large.startup()
    try:
        await kiq(large, "add", "y" * (DEFAULT_LIMIT + 1000), 1)
    finally:
        await large.shutdown()
    assert len(stored(broker)[-1]) > DEFAULT_LIMIT


class _Stamp(TaskiqMiddleware):
    """Sets a label in ``pre_send``, as a tracing middleware does."""

    def pre_send(self, message: TaskiqMessage) -> TaskiqMessage:
        message.labels["stamped"] = "yes"
        return message


@pytest.mark.parametrize("how", ["add_middlewares", "with_middlewares", "appended"])
async def test_a_middleware_added_later_still_shapes_the_task_that_is_sent(client, broker, how):
    """The size check serializes the task ahead of kiq(); what is sent is the task as
    every middleware left it, however the middleware was added."""
    stamp = _Stamp()
    if how == "appended":  # by hand, after the broker's check: serialized again
        stamp.set_broker(client)
        client.middlewares.append(stamp)
    else:
        getattr(client, how)(stamp)
        assert type(client.middlewares[-1]).__name__ == "_SendCheck"
    task = await kiq(client, "add", 1, 2)
    [body] = stored(broker)
    assert task.task_id in body and '"stamped":"yes"' in body.replace(" ", "")
