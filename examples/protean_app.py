"""A Protean domain on the SimpleBroker provider: orders, mailed and stocked.

Placing an order raises ``OrderPlaced``; two event handlers, each its own
consumer group of the ``shop::order`` stream, get every one of them:
``Mailer`` (sends the confirmation) and ``Stock`` (reserves the items).
Run any number of workers; the workers of one group share its orders.

    SHOP_BROKER_URI=redis://127.0.0.1:6379/0 python protean_app.py worker   # Protean's engine
    SHOP_BROKER_URI=redis://127.0.0.1:6379/0 python protean_app.py place 5   # five orders

``SHOP_BROKER_URI`` is any target of the provider: a ``redis://`` (or
``rediss://``, ``unix://``, ``redis+cluster://``, ``redis+sentinel://``)
URL, or a SQLite file path (the default, ``.demo/protean-shop.db``: no
server at all). ``make demo-protean`` (protean_demo.py) runs it all.

An order for ``bounce@example.com`` makes the mailer fail: the engine
retries it twice, then moves it to the ``shop::order:dlq`` dead letters.
"""

import logging
import os
import sys
from pathlib import Path

from protean import Domain, UnitOfWork, handle
from protean.core.event_handler import BaseEventHandler
from protean.fields import Identifier, Integer, String
from protean.utils.globals import current_domain

# Warnings only (retries, dead letters); Protean leaves logging alone once set.
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
# A failing handler is logged (with its traceback) by these two, and the
# subscription's retry and dead-letter warnings say the same in one line.
logging.getLogger("protean.access").setLevel(logging.CRITICAL)
logging.getLogger("protean.server.engine").setLevel(logging.CRITICAL)

URI = os.environ.get(
    "SHOP_BROKER_URI", str(Path(__file__).resolve().parents[1] / ".demo" / "protean-shop.db")
)

domain = Domain(name="shop")
domain.config["brokers"]["default"] = {"provider": "simplebroker", "URI": URI}
if "://" in URI and not URI.startswith("sqlite:"):
    domain.config["brokers"]["default"]["NAMESPACE"] = "shop"
# Stream subscriptions (the broker) rather than the event store; this also
# turns on the outbox: an order and its event are committed together.
domain.config["server"]["default_subscription_type"] = "stream"
domain.config["server"]["health"] = {"enabled": False}
domain.config["server"]["stream_subscription"].update(max_retries=2, retry_delay_seconds=0.2)


@domain.aggregate
class Order:
    email: String(required=True)
    items: Integer(default=1)

    @classmethod
    def place(cls, email: str, items: int) -> "Order":
        order = cls(email=email, items=items)
        order.raise_(OrderPlaced(order_id=order.id, email=email, items=items))
        return order


@domain.event(part_of=Order)
class OrderPlaced:
    order_id: Identifier(required=True)
    email: String()
    items: Integer()


class Mailer(BaseEventHandler):
    @handle(OrderPlaced)
    def send_confirmation(self, event: OrderPlaced) -> None:
        if event.email.startswith("bounce@"):
            raise RuntimeError(f"mail to {event.email} bounced")
        print(f"[mailer pid {os.getpid()}] confirmation for {event.order_id} sent", flush=True)


class Stock(BaseEventHandler):
    @handle(OrderPlaced)
    def reserve_items(self, event: OrderPlaced) -> None:
        print(
            f"[stock  pid {os.getpid()}] {event.items} item(s) reserved for {event.order_id}",
            flush=True,
        )


def worker() -> None:
    """Run Protean's engine with both handlers until SIGTERM or Ctrl-C."""
    from protean.server import Engine

    domain.register(Mailer, part_of=Order)
    domain.register(Stock, part_of=Order)
    domain.init(traverse=False)
    with domain.domain_context():
        print(f"worker ready (pid {os.getpid()}, broker {URI})", flush=True)
        Engine(domain).run()


def place(count: int) -> None:
    """Place ``count`` orders (the last one bounces) and publish them through the outbox."""
    from protean.server import Engine

    domain.init(traverse=False)  # no handlers here: this process only produces
    with domain.domain_context():
        repository = current_domain.repository_for(Order)
        for n in range(count):
            email = "bounce@example.com" if n == count - 1 else f"customer{n}@example.com"
            with UnitOfWork():
                repository.add(Order.place(email, items=n + 1))
        # The outbox processor publishes the committed events to the broker;
        # test mode stops once the outbox is drained.
        Engine(domain, test_mode=True).run()
    print(f"placed {count} orders", flush=True)


def main(argv: list[str]) -> None:
    """Run ``worker`` or ``place [COUNT]``."""
    if argv[:1] == ["worker"]:
        worker()
    elif argv[:1] == ["place"]:
        place(int(argv[1]) if len(argv) > 1 else 5)
    else:
        raise SystemExit("usage: protean_app.py worker | place [COUNT]")


if __name__ == "__main__":
    # Run the module under its own name, so the consumer groups are named
    # protean_app.Mailer and protean_app.Stock (not __main__.*).
    import protean_app

    protean_app.main(sys.argv[1:])
