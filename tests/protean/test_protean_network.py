"""Network faults and stalls under Protean's engine, on Redis (issue 42).

- An engine stopped (SIGSTOP) for three leases starts none of the messages
  it had reserved ahead once it wakes (their leases ran out: another
  engine took them over), and its late acknowledgements are refused.
- An engine cut off from the server for longer than the lease handles no
  message twice.
- A publish whose replies are cut off fails within its bound with
  ``OutcomeUnknown``; publishing the same message again stores it once.
- A renewal that runs just after an acknowledgement landed does not report
  the token lost: this consumer settled it, nobody took it over.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import papp
import pytest
from phelpers import handler_calls
from test_protean_engine import done, publish_orders

from simplebroker_redis import OutcomeUnknown
from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy
from support.waiting import wait_for

# Network-fault trials of workers: their scripts (idempotent writes, spared
# recoveries) run on each server binary in tests/test_write_once.py and
# tests/test_holdings.py.
pytestmark = pytest.mark.once

FAST = {"PBK_LEASE": "1.0", "PBK_HEARTBEAT": "0.2", "PBK_RECOVER": "0.2"}


@pytest.fixture
def backend() -> str:
    """Redis only: these faults are a network's and a lease's."""
    return "redis"


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def _mailer(events, what: str, pid: int | None = None) -> list[dict]:
    return [
        e
        for e in handler_calls(events)
        if e["h"] == "mailer" and e["what"] == what and (pid is None or e["pid"] == pid)
    ]


def test_an_engine_stopped_past_its_lease_starts_nothing_it_had_reserved(
    broker, start_worker, events
):
    stopped, live = start_worker(env=FAST), start_worker(env=FAST)
    for worker in (stopped, live):
        worker.wait_ready()
    orders = [f"o{i}" for i in range(24)]
    publish_orders(broker, *((order, "sleep", "0.2") for order in orders))

    def in_flight() -> set[str]:
        started = {e["id"] for e in _mailer(events, "start", stopped.pid)}
        return started - {e["id"] for e in _mailer(events, "done", stopped.pid)}

    wait_for(in_flight, timeout=60, interval=0.01, what="the engine to be in a handler")
    stopped.signal(signal.SIGSTOP)
    held = in_flight()
    time.sleep(3.0)  # the fault: three leases frozen
    stopped.signal(signal.SIGCONT)
    wait_for(lambda: set(done(events, "mailer")) == set(orders), timeout=60, what="every order")
    starts = Counter(e["id"] for e in _mailer(events, "start"))
    twice = {order for order, n in starts.items() if n > 1}
    # Only what was in a handler when it stopped ran twice: nothing it had
    # reserved ahead started after it woke with its leases run out.
    assert twice <= held, (twice, held)


def test_a_stopped_engine_starts_no_message_of_any_group_another_engine_took_over(
    broker, start_worker, events
):
    """Neither group's subscription starts, after the stop, a copy another engine took over.

    Protean runs handlers on its event loop, one at a time: a read of one
    group could return a copy (checked, leased) while another group's
    handler ran, and a stop then left it waiting to start past its lease.
    """
    stopped, live = start_worker(env=FAST), start_worker(env=FAST)
    for worker in (stopped, live):
        worker.wait_ready()
    orders = [f"o{i}" for i in range(30)]
    publish_orders(broker, *((order, "sleep", "0.15") for order in orders))

    def in_flight() -> set[str]:
        started = {e["id"] for e in _mailer(events, "start", stopped.pid)}
        return started - {e["id"] for e in _mailer(events, "done", stopped.pid)}

    wait_for(in_flight, timeout=60, interval=0.01, what="the engine to be in a handler")
    stopped.signal(signal.SIGSTOP)
    stop = time.time()
    time.sleep(3.0)  # the fault: three leases frozen
    stopped.signal(signal.SIGCONT)
    resumed = time.time()
    for handler in ("mailer", "ledger"):
        wait_for(
            lambda handler=handler: set(done(events, handler)) == set(orders),
            timeout=60,
            what=f"every order by the {handler}",
        )
    starts = [e for e in handler_calls(events) if e["what"] == "start"]
    late = [
        (e["h"], e["id"])
        for e in starts
        if e["pid"] == stopped.pid
        and e["at"] >= resumed
        and any(
            o["h"] == e["h"]
            and o["id"] == e["id"]
            and o["pid"] == live.pid
            and stop < o["at"] < e["at"]
            for o in starts
        )
    ]
    assert late == []


def test_an_engine_cut_off_past_its_lease_handles_nothing_twice(
    broker, start_worker, events, proxy
):
    worker = start_worker(env={**FAST, "PBK_URI": proxy.url() + "?socket_timeout=1"})
    worker.wait_ready()
    orders = [f"o{i}" for i in range(20)]
    publish_orders(broker, *((order, "sleep", "0.2") for order in orders))
    wait_for(lambda: len(done(events, "mailer")) >= 2, timeout=60, interval=0.02, what="work")
    proxy.blackhole()
    time.sleep(2.5)  # the fault: 2.5 leases without a byte either way
    proxy.heal()
    wait_for(lambda: set(done(events, "mailer")) == set(orders), timeout=60, what="every order")
    wait_for(lambda: set(done(events, "ledger")) == set(orders), timeout=60, what="the ledger")
    assert set(done(events, "mailer").values()) == {1}
    assert set(done(events, "ledger").values()) == {1}
    assert "could renew them" not in worker.output()


def test_a_publish_with_its_replies_cut_off_fails_in_bounds_and_is_stored_once(
    make_broker, proxy, broker
):
    cut = make_broker(URI=proxy.url() + "?socket_timeout=2")
    publish_orders(cut, ("warm", "ok"))
    message = None
    with papp.domain.domain_context():
        message = papp.order_message("resent", "ok")
        proxy.blackhole("to_client")  # requests reach the server, replies do not
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown, match="outcome is unknown"):
            cut.publish(papp.STREAM, message)
        # Its write's one timeout: no PING and second try after it (Protean's
        # publish made them, and they waited a timeout each again).
        assert time.monotonic() - started < 4
        proxy.heal()
        identifier = cut.publish(papp.STREAM, message)
    log = broker.layout.log(papp.STREAM)
    stored = broker.store.peek(log, 100)
    headers_id = message["metadata"]["headers"]["id"]
    assert sum(headers_id in body for body, _ in stored) == 1
    assert [str(i) for body, i in stored if headers_id in body] == [identifier]


def test_an_acknowledgement_racing_with_a_renewal_is_not_reported_as_a_lost_lease(broker, caplog):
    """The heartbeat's renewal may run just after the server settled a token's last copy.

    The token went because this consumer's acknowledgement landed: nothing
    was taken over, and the heartbeat must not say so (nor count it lost).
    """
    broker.publish("race", {"n": 1})
    [(identifier, _)] = broker.read("race", "g", 1)
    store = broker.store
    heartbeat = store.heartbeat
    heartbeat.stop()  # this test runs the renewal itself, at the worst moment
    leases = store.leases
    ack = leases.ack

    def ack_then_renew(*args, **kwargs):
        settled = ack(*args, **kwargs)  # the server dropped the token
        heartbeat._renew(leases)  # the heartbeat thread's turn, before ack() returns
        return settled

    leases.ack = ack_then_renew
    with caplog.at_level("WARNING", logger="protean_simplebroker"):
        assert broker.ack("race", identifier, "g")
    assert "ran out before this process could renew" not in caplog.text
