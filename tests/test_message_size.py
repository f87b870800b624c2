"""``BROKER_MAX_MESSAGE_SIZE`` from the environment: one rule for every way a message is written.

The ``broker`` command reads SimpleBroker's settings from the environment;
so do a Taskiq ``kiq()``, a Celery publish, a Protean publish and a core
made on a runner without a config of its own. Lowered, the limit refuses
what the default takes; raised, it takes what the default (10 MB) refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from simplebroker import resolve_config
from simplebroker.ext import MessageError

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from support.namespaces import fresh_namespace

#: SimpleBroker's default limit.
DEFAULT_LIMIT = int(resolve_config()["MAX_MESSAGE_SIZE"])

#: A sender: a context manager giving ``send(body)`` on a server and namespace.
Sender = Callable[[str, str], Any]


@contextmanager
def _core(url: str, namespace: str) -> Iterator[Callable[[str], object]]:
    core = RedisBrokerCore(RedisRunner(url, namespace=namespace), owns_runner=True)
    yield lambda body: core.write("jobs", body)
    core.shutdown()


@contextmanager
def _taskiq(url: str, namespace: str) -> Iterator[Callable[[str], object]]:
    from taskiq.kicker import AsyncKicker

    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    broker = SimpleBrokerTaskiqBroker(url, namespace=namespace)

    async def kick(body: str) -> None:
        await AsyncKicker("app:echo", broker, {}).kiq(body)

    loop = asyncio.new_event_loop()
    yield lambda body: loop.run_until_complete(kick(body))
    loop.run_until_complete(broker.shutdown())
    loop.close()


@contextmanager
def _celery(url: str, namespace: str) -> Iterator[Callable[[str], object]]:
    from celery import Celery

    import celery_simplebroker  # noqa: F401 - registers the transport

    app = Celery("sizes", set_as_current=False)
    app.conf.update(
        broker_url=f"simplebroker+{url}", broker_transport_options={"namespace": namespace}
    )
    yield lambda body: app.send_task("echo", (body,))
    app.close()


@contextmanager
def _protean(url: str, namespace: str) -> Iterator[Callable[[str], object]]:
    from protean.domain import Domain

    from protean_simplebroker import SimpleBrokerBroker

    domain = Domain(name="sizes")
    table = {"provider": "simplebroker", "URI": url, "NAMESPACE": namespace}
    domain.config["brokers"]["default"] = table
    broker = SimpleBrokerBroker("default", domain, table)
    yield lambda body: broker.publish("orders", {"body": body})
    broker.close()


SENDERS = {"core": _core, "taskiq": _taskiq, "celery": _celery, "protean": _protean}


@pytest.mark.parametrize("integration", list(SENDERS))
def test_the_environment_sets_the_size_limit_everywhere(
    integration: str, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = SENDERS[integration]
    monkeypatch.setenv("BROKER_MAX_MESSAGE_SIZE", "4000")
    with sender(redis_url, namespace) as send:
        with pytest.raises(MessageError, match="BROKER_MAX_MESSAGE_SIZE"):
            send("x" * 6000)  # well under the default
        send("x" * 1000)
    monkeypatch.setenv("BROKER_MAX_MESSAGE_SIZE", str(DEFAULT_LIMIT + 1_000_000))
    # Another namespace: kombu keeps producers per connection, process-wide.
    with fresh_namespace(redis_url) as other, sender(redis_url, other) as send:
        send("y" * (DEFAULT_LIMIT + 1000))  # over the default
