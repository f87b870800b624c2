"""The Protean domain the provider's tests run: orders, and two event handlers.

Imported by the tests and by ``pworker.py`` (the engine processes). Its
configuration comes from the environment, so a worker process needs only
``PBK_*`` variables:

- ``PBK_URI`` (and ``PBK_NAMESPACE`` on Redis): the broker;
- ``PBK_LOG``: a file every handler call appends a JSON line to
  (``{"h": handler, "id": order id, "pid": ..., "what": "start"|"done", "at": time}``);
- ``PBK_LEASE``, ``PBK_HEARTBEAT``, ``PBK_MAX_DELIVERIES``, ``PBK_WAIT_REPLICAS``,
  ``PBK_WAIT_TIMEOUT``: provider settings.

An order's ``mode`` tells the ``Mailer`` handler what to do: ``ok``;
``slow`` (work ``PBK_TASK_SECONDS``, default 0.1); ``fail`` (raise, every
time); ``block`` (log ``start``, then wait until the file named by the
order's ``customer`` exists, then finish); ``sleep`` (take as many seconds
as the order's ``customer`` says).
``Ledger`` always succeeds: it is the second consumer group.
"""

# No ``from __future__ import annotations``: Protean reads the field
# declarations (``customer: String()``) as live annotations.
import json
import os
import time
from typing import Any

from protean import Domain, handle
from protean.fields import Identifier, String
from protean.utils.eventing import Message

from support.eventlog import append_line

domain = Domain(name="shop")


@domain.aggregate
class Order:
    customer: String()


@domain.event(part_of=Order)
class OrderPlaced:
    order_id: Identifier()
    mode: String()
    customer: String()


def record(handler: str, event: Any, what: str) -> None:
    """Append one line to the log (O_APPEND: lines of several processes never mix)."""
    line = {"h": handler, "id": event.order_id, "pid": os.getpid(), "what": what, "at": time.time()}
    append_line(os.environ["PBK_LOG"], json.dumps(line))


@domain.event_handler(part_of=Order)
class Mailer:
    @handle(OrderPlaced)
    def on_placed(self, event: OrderPlaced) -> None:
        record("mailer", event, "start")
        if event.mode == "slow":
            time.sleep(float(os.environ.get("PBK_TASK_SECONDS", "0.1")))
        if event.mode == "fail":
            raise RuntimeError(f"mailer cannot send {event.order_id}")
        if event.mode == "block":
            while not os.path.exists(event.customer):
                time.sleep(0.02)  # the test creates the file when the handler may end
        if event.mode == "sleep":
            time.sleep(float(event.customer))
        record("mailer", event, "done")


@domain.event_handler(part_of=Order)
class Ledger:
    @handle(OrderPlaced)
    def on_placed(self, event: OrderPlaced) -> None:
        record("ledger", event, "start")
        record("ledger", event, "done")


STREAM = "shop::order"
MAILER = "papp.Mailer"
LEDGER = "papp.Ledger"


def conn_info() -> dict[str, Any]:
    """Return the broker table the environment describes."""
    info: dict[str, Any] = {"provider": "simplebroker", "URI": os.environ["PBK_URI"]}
    if os.environ.get("PBK_NAMESPACE"):
        info["NAMESPACE"] = os.environ["PBK_NAMESPACE"]
    for key, name in (
        ("PBK_LEASE", "LEASE_SECONDS"),
        ("PBK_HEARTBEAT", "HEARTBEAT_SECONDS"),
        ("PBK_RECOVER", "RECOVER_SECONDS"),
    ):
        if os.environ.get(key):
            info[name] = float(os.environ[key])
    if os.environ.get("PBK_MAX_DELIVERIES"):
        info["MAX_DELIVERIES"] = int(os.environ["PBK_MAX_DELIVERIES"])
    if os.environ.get("PBK_WAIT_REPLICAS"):
        info["WAIT_REPLICAS"] = int(os.environ["PBK_WAIT_REPLICAS"])
        info["WAIT_TIMEOUT"] = float(os.environ.get("PBK_WAIT_TIMEOUT", "1.0"))
    return info


def configure() -> Domain:
    """Configure and initialize the domain from the environment (once per process)."""
    config = domain.config
    config["brokers"]["default"] = conn_info()
    server = config["server"]
    server["default_subscription_type"] = "stream"
    server["health"] = {"enabled": False}
    server["stream_subscription"]["max_retries"] = 2
    server["stream_subscription"]["retry_delay_seconds"] = 0.05
    server["stream_subscription"]["blocking_timeout_ms"] = 1000
    domain.init(traverse=False)
    return domain


def order_message(order_id: str, mode: str = "ok", customer: str = "") -> dict[str, Any]:
    """Return the broker message the outbox would publish for a new order."""
    order = Order(customer=customer or order_id)
    order.raise_(OrderPlaced(order_id=order_id, mode=mode, customer=customer))
    return Message.from_domain_object(order._events[-1]).to_dict()
