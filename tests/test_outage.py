"""The one outage policy of wake-up subscriptions (sync listener and AsyncActivity)."""

from __future__ import annotations

import logging

import pytest
import redis
import redis.exceptions as rx

from simplebroker_redis import RedisRunner
from simplebroker_redis.activity.outage import STABLE_AFTER, Outage, SlotMoved
from simplebroker_redis.retry import BACKOFF_MIN


@pytest.fixture
def outage(redis_url: str, namespace: str):
    runner = RedisRunner(redis_url, namespace=namespace)
    yield Outage(runner.connections, runner.where)
    runner.close()


def test_one_warning_per_outage_and_backoff_until_a_subscription_lasts(outage, caplog):
    lost = redis.ConnectionError("gone")
    with caplog.at_level(logging.INFO, logger="simplebroker_redis"):
        delays = [outage.lost(lost, None) for _ in range(3)]
        outage.subscribed()
        outage.subscribed()
        brief = outage.lost(SlotMoved("sb:{ns}:wake:q"), STABLE_AFTER / 2)  # the same outage
        lasted = outage.lost(lost, STABLE_AFTER)  # it lasted: a new outage
    assert delays == [BACKOFF_MIN, BACKOFF_MIN * 2, BACKOFF_MIN * 4]
    assert brief == BACKOFF_MIN * 8
    assert lasted == BACKOFF_MIN
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if "lost" in m] == [
        f"wake-up subscription at {outage._where} lost: ConnectionError: gone; reconnecting"
    ] * 2
    assert sum("restored" in m for m in messages) == 1


def test_a_failure_that_is_not_the_connection_is_named_so(outage, caplog):
    with caplog.at_level(logging.WARNING, logger="simplebroker_redis"):
        outage.lost(RuntimeError("bug"), None)
    assert "failed: RuntimeError: bug" in caplog.records[0].getMessage()


def test_a_moved_answer_repoints_the_route(outage):
    outage.lost(rx.MovedError("1234 10.0.0.9:7001"), None)
    assert outage._connections.owner() == ("10.0.0.9", 7001)
