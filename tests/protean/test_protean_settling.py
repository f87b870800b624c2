"""What a publish or an acknowledgement that does not fully succeed leaves behind (issue 42).

- A publish with ``WAIT_REPLICAS`` that no replica confirms in time raises
  ``UnconfirmedPublish`` (it returned success before, and such messages
  were lost on failover); the message is stored once, and publishing it
  again stores nothing more.
- An acknowledgement that fails for good lets its copy go: nothing renews
  it any more, and it returns to its group after its lease.
"""

from __future__ import annotations

import threading
import time

import papp
import pytest
from test_protean_engine import publish_orders

from protean_simplebroker import UnconfirmedPublish
from protean_simplebroker import redis_store as redis_store_module
from simplebroker_redis import ReplicationTimeout
from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy
from support.waiting import wait_for

pytestmark = pytest.mark.once


@pytest.fixture
def backend() -> str:
    """Redis only: replicas and leases are the server's."""
    return "redis"


def _stored(broker, message) -> list[str]:
    """Return the log identifiers under which ``message`` is stored."""
    headers_id = message["metadata"]["headers"]["id"]
    log = broker.layout.log(papp.STREAM)
    return [str(i) for body, i in broker.store.peek(log, 100) if headers_id in body]


def test_a_publish_no_replica_confirmed_raises_and_is_stored_once(make_broker, broker):
    # The suite's server has no replica: WAIT always falls short.
    unconfirmed = make_broker(WAIT_REPLICAS=1, WAIT_TIMEOUT=0.05)
    publish_orders(broker, ("warm", "ok"))  # the domain, initialized
    with papp.domain.domain_context():
        message = papp.order_message("o1", "ok")
        with pytest.raises(
            UnconfirmedPublish, match="whether it survives a failover is unknown"
        ) as raised:
            unconfirmed.publish(papp.STREAM, message)
        assert isinstance(raised.value, ReplicationTimeout)  # caught as the backend's too
        assert isinstance(raised.value.__cause__, ReplicationTimeout)
        assert raised.value.stream == papp.STREAM
        assert _stored(broker, message) == [raised.value.identifier]
        # Published again (the documented remedy): stored once, not confirmed still.
        with pytest.raises(UnconfirmedPublish) as again:
            unconfirmed.publish(papp.STREAM, message)
    assert again.value.identifier == raised.value.identifier
    assert _stored(broker, message) == [raised.value.identifier]
    # Its consumers have it: it was stored on the primary.
    assert [i for i, _ in broker.read(papp.STREAM, "g", 10)][-1] == raised.value.identifier


def test_an_acknowledgement_that_fails_for_good_lets_the_copy_go(
    make_broker, broker, server: DevServer, monkeypatch
):
    monkeypatch.setattr(redis_store_module, "ACK_RETRY_SECONDS", 0.5)
    with FaultProxy(("127.0.0.1", server.port)) as proxy:
        consumer = make_broker(URI=proxy.url() + "?socket_timeout=0.3")
        broker.publish("jobs", {"n": 1})
        [(identifier, _)] = consumer.read("jobs", "g", 1)
        holdings = consumer.store.holdings
        [token] = holdings.tokens()
        proxy.reset()  # every connection reset, new ones refused
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the driver raised
            consumer.ack("jobs", identifier, "g")
        # Let go: not renewed any more, not in flight; a second ack has nothing to do.
        assert not holdings.holds(token)
        assert consumer.ack("jobs", identifier, "g") is False
        proxy.heal()
        # Its lease runs out (nobody renews it) and another consumer gets it.
        redelivered = wait_for(
            lambda: broker.read("jobs", "g", 1), timeout=30, interval=0.1, what="the redelivery"
        )
    assert [i for i, _ in redelivered] == [identifier]


def test_a_subscription_read_waits_while_another_groups_message_is_in_a_handler(broker):
    """A read of an owned group hands nothing out while another owned group's message runs.

    Protean's handlers run one at a time on its event loop: a copy handed
    out meanwhile would wait, checked, for that handler, and a stop of
    the process then would start it past its lease.
    """
    for group in ("a", "b"):
        broker._mark_subscription_owned("jobs", group)
    broker.publish("jobs", {"n": 1})
    [(first, _)] = broker.read("jobs", "a", 1)  # "in a handler" until settled
    assert broker.read("jobs", "b", 1) == []  # does not wait: returns nothing
    started = time.monotonic()
    assert broker.read_blocking("jobs", "b", "c", timeout_ms=300) == []
    assert time.monotonic() - started >= 0.25  # waited its whole timeout
    got: list[list[tuple[str, dict]]] = []
    reader = threading.Thread(
        target=lambda: got.append(broker.read_blocking("jobs", "b", "c", timeout_ms=1000))
    )
    reader.start()
    assert broker.ack("jobs", first, "a")  # the handler ended: the read goes on
    reader.join()
    assert [[payload for _, payload in taken] for taken in got] == [[{"n": 1}]]
    broker.publish("jobs", {"n": 2})
    # A group's own next read does not wait for its own last message (its
    # subscription reads only once it handled it).
    [(b_second, payload)] = broker.read("jobs", "b", 1)
    assert payload == {"n": 2}
    assert broker.read("jobs", "a", 1) == []  # b's is in a handler now
    assert broker.ack("jobs", b_second, "b")
    assert [p for _, p in broker.read("jobs", "a", 1)] == [{"n": 2}]
