"""Protean's engine running a real domain on the provider, in processes of its own.

The engine (``pworker.py engine``) runs ``papp``'s two event handlers as
stream subscriptions: two consumer groups of the ``shop::order`` stream.
The test process publishes what the outbox would publish. On Redis and on
SQLite: every message reaches both groups once; a failing handler is
retried by the subscription and dead-lettered; a consumer killed in a
handler keeps its message while it lives and loses it to another once
dead; a message whose consumers keep dying ends in the dead letters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import papp
import pytest
from phelpers import HERE, LEASE, PYTHONPATH, handler_calls

from support.waiting import wait_for

# Protean's engine in processes of its own: its server side is the lease
# scripts, which every other test runs on each server binary.
pytestmark = pytest.mark.once

DLQ = f"{papp.STREAM}:dlq"
_INITIALIZED: list[bool] = []


def publish_orders(broker, *orders):
    """Publish what the outbox would for ``(order id, mode, customer)`` orders; return their IDs."""
    if not _INITIALIZED:
        papp.domain.init(traverse=False)  # the default (inline) broker: only messages are built
        _INITIALIZED.append(True)
    with papp.domain.domain_context():
        return [broker.publish(papp.STREAM, papp.order_message(*order)) for order in orders]


def done(events, handler):
    return Counter(
        e["id"] for e in handler_calls(events) if e["h"] == handler and e["what"] == "done"
    )


def test_every_order_reaches_both_groups_once_and_a_failing_one_is_dead_lettered(
    broker, start_worker, events
):
    orders = [(f"o{i}", "ok") for i in range(20)] + [("bad", "fail")]
    ids = publish_orders(broker, *orders)
    workers = [start_worker(), start_worker()]
    for worker in workers:
        worker.wait_ready()
    wanted = {order for order, _ in orders}
    wait_for(lambda: set(done(events, "ledger")) == wanted, what="the ledger group")
    wait_for(lambda: len(done(events, "mailer")) == 20, what="the mailer group")
    wait_for(lambda: broker.dlq_depth(DLQ) == 1, what="the dead letter")
    # Exactly once per group: no message went to two consumers of one group.
    assert set(done(events, "ledger").values()) == {1}
    assert set(done(events, "mailer").values()) == {1}
    assert "bad" not in done(events, "mailer")
    # The subscription tried twice (max_retries = 2), then published to the DLQ.
    starts = [e for e in handler_calls(events) if e["id"] == "bad" and e["h"] == "mailer"]
    assert len(starts) == 2
    [entry] = broker.dlq_list([DLQ])
    assert (entry.original_id, entry.consumer_group) == (ids[-1], papp.MAILER)
    assert entry.payload["data"]["order_id"] == "bad"
    info = broker.info()["consumer_groups"]
    assert info[papp.MAILER]["pending"] == info[papp.LEDGER]["pending"] == 0


def test_a_killed_consumer_keeps_its_message_while_alive_and_loses_it_when_dead(
    broker, start_worker, events, tmp_path
):
    release = tmp_path / "release"
    publish_orders(broker, ("slow", "block", str(release)))
    first = start_worker()
    first.wait_ready()

    def started_by(pid):
        # The mailer's: the first engine's ledger waits for the blocked
        # handler before it takes the order, so the second one's ledger may.
        return [
            e
            for e in handler_calls(events)
            if e["id"] == "slow" and e["pid"] == pid and e["h"] == "mailer"
        ]

    wait_for(lambda: started_by(first.pid), what="the first worker to start the slow order")
    started = time.monotonic()
    # The blocked handler blocks the first engine's loop: orders published
    # from now on are the second worker's to handle.
    second = start_worker()
    second.wait_ready()
    # Past twice the lease the living holder keeps its message (renewed on
    # Redis; its lock held on SQLite), while the second worker, reading all
    # along, handles one order after another and never "slow".
    orders = ["slow"]
    while time.monotonic() < started + 2.5 * LEASE or len(orders) < 2:
        orders.append(f"probe{len(orders)}")
        publish_orders(broker, (orders[-1], "ok"))
        wait_for(lambda: done(events, "mailer")[orders[-1]] == 1, what=f"order {orders[-1]}")
        assert not started_by(second.pid)
    first.kill()
    wait_for(lambda: started_by(second.pid), timeout=30, what="the second worker to take it over")
    release.touch()
    wait_for(lambda: done(events, "mailer")["slow"] == 1, what="the slow order to finish")
    # The first engine's ledger subscription may have reserved some orders
    # (its reads run in a thread) while its loop was blocked: they came back
    # when that engine died.
    wait_for(lambda: len(done(events, "ledger")) == len(orders), what="the ledger group")
    # Nothing lost, nothing twice.
    assert done(events, "mailer") == Counter(orders)
    assert done(events, "ledger") == Counter(orders)


def test_a_message_whose_consumers_keep_dying_ends_in_the_dead_letters(make_broker, worker_env):
    broker = make_broker(MAX_DELIVERIES=2)  # as every consumer of the deployment
    [identifier] = publish_orders(broker, ("poison", "ok"))
    env = {**worker_env, "PBK_MAX_DELIVERIES": "2"}
    die = [sys.executable, str(HERE / "pworker.py"), "take-and-die", papp.STREAM, papp.MAILER]
    for _ in range(2):
        dying = subprocess.run(die, env=env, cwd=str(HERE), capture_output=True, text=True)
        assert dying.returncode == -9, dying.stdout + dying.stderr
        assert dying.stdout.split() == ["took", identifier]
    broker._ensure_group(papp.MAILER, papp.STREAM)

    def dead():
        broker.get_next(papp.STREAM, papp.MAILER)  # upkeep (Redis) or recovery (SQLite)
        return broker.dlq_list([DLQ])

    [entry] = wait_for(dead, timeout=10 * LEASE, what="the dead letter")
    assert (entry.original_id, entry.consumer_group) == (identifier, papp.MAILER)
    assert entry.failure_reason == "max_retries_exceeded"
    assert broker.get_next(papp.STREAM, papp.MAILER) is None


def test_the_broker_cli_shows_the_streams_groups_and_dead_letters(broker, backend, tmp_path):
    publish_orders(broker, ("cli", "ok"))
    broker.get_next(papp.STREAM, papp.MAILER)
    broker.publish(DLQ, {"n": 1, "_dlq_metadata": {"original_id": "1"}})
    cli = [str(Path(sys.executable).with_name("broker"))]
    if backend == "sqlite":
        cli += ["-f", broker.settings.target]
    else:
        (tmp_path / ".broker.toml").write_text(
            f'version = 1\nbackend = "redis"\ntarget = "{broker.settings.target}"\n'
            f'[backend_options]\nnamespace = "{broker.settings.namespace}"\n'
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONPATH"] = PYTHONPATH

    def run(*args):
        return subprocess.run(
            [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
        ).stdout.split("\n")

    listed = set(run("list"))
    assert {"protean.shop-3a-3aorder", "protean.shop-3a-3aorder-3adlq"} <= listed
    assert "protean.shop-3a-3aorder--papp.Mailer--at" in listed
    [peeked] = [line for line in run("peek", "protean.shop-3a-3aorder-3adlq") if line]
    assert '"_dlq_metadata"' in peeked
