"""The kombu transport: its lifecycle and kombu's hooks, over a store and a poller.

Select it with ``broker_url = "simplebroker+redis://host:6379/0"`` after
``import celery_simplebroker`` (which registers the ``simplebroker`` alias),
or with ``broker_transport = "celery_simplebroker.transport:Transport"`` and
``broker_url = "redis://host:6379/0"``. See ``docs/celery.md``.

A transport is kombu's shape of a virtual transport, in parts:

- :class:`~.store.Store`: what is done on the server (publish, reserve,
  claim, acknowledge, release, dead-letter, purge) and the heartbeat that
  renews what the process holds;
- :class:`~.poller.Poller`: when to poll (drains, the event loop's tick and
  alarm, wake-ups);
- :class:`~.bindings.Declarations`: declared queues and shared bindings;
- :class:`~.acks.ResultAcks` (the store's): messages the result backend
  acknowledges together with their result.

The transport is asynchronous: a worker (other than a gevent or eventlet
one) runs it in its event loop, Celery's hub (:meth:`Transport.register_with_event_loop`),
which it needs for its prefork pool's asynchronous form.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

import redis
from kombu.transport import virtual
from simplebroker.ext import OperationalError

from . import acks
from .bindings import Declarations
from .channel import Channel
from .cycle import ControlFirstCycle
from .errors import (
    AuthenticationFailed,
    ConnectTimedOut,
    ServerUnreachable,
    typed_connection_errors,
)
from .options import (
    TRANSPORT_OPTIONS,
    TransportOptions,
    client_target,
    runner_options,
    shown_url,
    warn_unknown_options,
)
from .poller import Poller
from .store import Store

logger = logging.getLogger("celery_simplebroker")

#: Namespaces (runner identities) this process has connected to and validated.
_VALIDATED: set[tuple[str, str | None, str]] = set()


class Transport(virtual.Transport):
    """kombu transport on simplebroker-redis: leases, heartbeat, Pub/Sub wake-ups."""

    Channel = Channel
    Cycle = ControlFirstCycle  # remote control before tasks (see .cycle)
    driver_type = "redis"
    driver_name = "simplebroker-redis"  # taskstats.DRIVER_NAME finds apps on this transport
    #: The URL (``redis://``, ``rediss://``, ``unix://``) is the runner's target, unparsed.
    can_parse_url = True
    # kombu annotates the base's value as a one-element tuple. Connection
    # failures at connect time are raised as the redis-py types Celery users
    # catch (AuthenticationError, TimeoutError, ConnectionError), each also
    # a SimpleBroker OperationalError (see errors.py).
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        OperationalError,
        AuthenticationFailed,
        ConnectTimedOut,
        ServerUnreachable,
        redis.ConnectionError,
        redis.TimeoutError,
    )
    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        raw_options: Mapping[str, Any] = client.transport_options or {}
        self.options = TransportOptions.parse(raw_options)
        warn_unknown_options("broker_transport_options", raw_options, TRANSPORT_OPTIONS)
        server = client_target(client)
        self.target = server.target
        self.runner = server.with_options(runner_options(raw_options)).runner()
        self.store = Store(self.runner, self.options, on_beat=self._refresh_bindings)
        # kombu declares a publish's queue before each try: bounded as the publish is.
        self.declared = Declarations(self.store.publishing)
        self.poller = Poller(
            self.store, self.options, channels=lambda: self.channels, poll=self._poll
        )
        self.store.acks.prefetcher = self.poller

    def driver_version(self) -> str:
        """Return this package's version and redis-py's (``celery report``, ``inspect report``)."""
        return f"{version('simplebroker-redis')} (redis-py {redis.__version__})"

    # -- connection lifecycle --------------------------------------------------------
    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """Return the broker URL for Celery's banner and logs (any target form, password hidden)."""
        return shown_url(self.target, include_password)

    def establish_connection(self) -> Any:
        """Reach the server and create or validate the namespace (kombu retries failures).

        Once per process and namespace: a later connection (kombu's
        reconnect before it retries a publish, a consumer restart) opens
        nothing until it is used, so a publish retried in an outage fails
        with its own error (:mod:`.publishing`), and a consumer rides the
        outage out (:mod:`.outage`) instead of waiting for Celery's retries.
        """
        identity = self.runner.identity
        if identity in _VALIDATED:
            self.runner.mark_initialized()
        else:
            with typed_connection_errors():
                self.runner.ensure_initialized()
            _VALIDATED.add(identity)
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        """Close channels (handing held messages back), the heartbeat, and the pool."""
        acks.release(self.store.acks)  # the result backend no longer finds its messages here
        self.poller.close()
        try:
            super().close_connection(connection)
        finally:
            self.store.close()
            self.poller.unsubscribe()
            self.runner.close()

    # -- delivering ------------------------------------------------------------------------
    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver one message, waiting on wake-ups rather than polling."""
        self.poller.drain(timeout)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Deliver from ``loop`` (Celery's hub), in the reader of the wake-ups' alarm."""
        self.poller.register(loop)

    def _poll(self, timeout: float | None) -> None:
        """Deliver one message of some consumed queue, in kombu's fair order (or raise Empty)."""
        cycle: Any = self.cycle
        cycle.get(self._deliver, timeout=timeout)

    def _refresh_bindings(self) -> None:
        """Keep the bindings of the expiring queues this process consumes (heartbeat thread)."""
        self.declared.refresh(self.poller.consumed_queues())
