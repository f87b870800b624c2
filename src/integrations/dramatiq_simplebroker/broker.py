"""``SimpleBrokerDramatiqBroker``: Dramatiq's broker on SimpleBroker queues in Valkey/Redis.

Use it where Dramatiq's ``RedisBroker`` goes::

    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker
    dramatiq.set_broker(SimpleBrokerDramatiqBroker(url="redis://127.0.0.1:6379/0"))

and run workers as usual (``dramatiq app --processes 2 --threads 8``).

What differs from ``RedisBroker`` (``docs/dramatiq.md``):

- a message a worker takes is *reserved* under a lease that the process's
  one heartbeat thread renews; a killed worker's messages come back when
  the lease runs out (``lease_seconds``, 10 s by default), not after
  ``heartbeat_timeout`` plus a random maintenance pass;
- delays are the storage's own (a delayed message becomes claimable on the
  server's clock): there are no ``.DQ`` queues and no ETA lists in workers
  (``get_declared_delay_queues()`` is empty);
- an actor's ``priority`` orders its queue for every worker: lower first,
  as Dramatiq orders its in-memory work queue;
- idle consumers sleep on Pub/Sub wake-ups instead of polling;
- the dashboard finds a message by its ID (the task index) and counts
  messages per actor (:mod:`.taskstats`), unless ``task_index=False`` /
  ``task_stats=False``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from dramatiq.broker import Broker, Consumer
from dramatiq.common import q_name
from dramatiq.errors import QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from simplebroker_redis import RedisRunner, tasks
from simplebroker_redis.activity import close_idle_listeners
from simplebroker_redis.codec import encode_body
from simplebroker_redis.server import Target

from .config import (
    DEFAULT_DEAD_MESSAGE_TTL,
    DEFAULT_IDLE_RECHECK,
    DEFAULT_MAX_DELIVERIES,
    ConfigurationError,
    Settings,
    choose_target,
    dead_letter_queue,
    make_settings,
    storage_queue,
)
from .consumer import LeaseFence, SimpleBrokerConsumer, connection_errors
from .store import Store
from .taskformat import FRAMEWORK
from .taskstats import TaskStatsMiddleware

logger = logging.getLogger("dramatiq_simplebroker")

#: Milliseconds between two looks of :meth:`SimpleBrokerDramatiqBroker.join`.
JOIN_INTERVAL_MS = 100


class SimpleBrokerDramatiqBroker(Broker):
    """A Dramatiq broker whose queues are SimpleBroker queues on Valkey/Redis.

    Args:
        url: A backend target (``redis://``, ``rediss://``,
            ``redis+sentinel://``, ``redis+cluster://``); None:
            ``$SIMPLEBROKER_REDIS_URL``, else the ``.broker.toml`` of the
            working directory (see :mod:`.config`).
        middleware: As for every Dramatiq broker.
        namespace: The SimpleBroker namespace (default: the project's, else
            ``simplebroker_redis_v1``).
        lease_seconds: How long a reservation lives without renewal: a dead
            worker's messages return after it (default 10).
        heartbeat_interval, recover_interval: The heartbeat's pace (default:
            a quarter of the lease, at most 2 s; recovery every 1 s).
        max_deliveries: Deliveries after which a message whose workers keep
            dying goes to the dead-letter queue (None: never).
        dead_message_ttl: Milliseconds a nacked message is kept in
            ``<queue>.XQ`` (Dramatiq's default: 7 days).
        idle_recheck: Seconds an idle consumer trusts its wake-ups before it
            asks the server anyway.
        backend_options: More ``[backend_options]`` (``wait_replicas``,
            ``max_connections``, ...).
        runner: A runner to share (then ``url`` and the options are not used
            for connecting).
        task_index: Index each message under its message ID, so the
            dashboard finds it (None: ``SIMPLEBROKER_REDIS_TASK_INDEX``, on
            by default).
        task_stats: Count messages sent and runs per actor for the
            dashboard and the exporter (:mod:`.taskstats`; None:
            ``SIMPLEBROKER_REDIS_TASK_STATS``, on by default).

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        middleware: list[Middleware] | None = None,
        namespace: str | None = None,
        lease_seconds: float | None = None,
        heartbeat_interval: float | None = None,
        recover_interval: float | None = None,
        max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
        dead_message_ttl: int = DEFAULT_DEAD_MESSAGE_TTL,
        idle_recheck: float = DEFAULT_IDLE_RECHECK,
        backend_options: Mapping[str, Any] | None = None,
        runner: RedisRunner | None = None,
        task_index: bool | None = None,
        task_stats: bool | None = None,
    ) -> None:
        if runner is not None:
            target = Target(runner.target, {"namespace": runner.keys.namespace}, "runner")
        else:
            target = choose_target(url, namespace, backend_options)
        self.settings: Settings = make_settings(
            target,
            lease_seconds=lease_seconds,
            heartbeat_interval=heartbeat_interval,
            recover_interval=recover_interval,
            max_deliveries=max_deliveries,
            dead_message_ttl=dead_message_ttl,
            idle_recheck=idle_recheck,
        )
        self._declared = 0  #: actors declared so far (a consumer re-reads its levels on change)
        super().__init__(middleware=middleware)
        self.queues: set[str] = set()
        self.store = Store(self.settings, runner)
        self._fence = LeaseFence(self.store)
        #: Whether messages are indexed under their message ID (the result backend follows it).
        self.task_index = tasks.enabled(task_index, tasks.INDEX_ENV)
        self.task_stats: tasks.TaskStats | None = None  #: this process's counts (None: off)
        if tasks.enabled(task_stats):
            self.task_stats = tasks.task_stats(self.store.runner)
            self.add_middleware(TaskStatsMiddleware(self.task_stats))

    @property
    def dead_message_ttl(self) -> int:
        """Return how long (ms) nacked messages are kept (``RedisBroker``'s attribute)."""
        return self.store.dead_message_ttl

    @dead_message_ttl.setter
    def dead_message_ttl(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError("dead_message_ttl must be an integer >= 0")
        self.store.dead_message_ttl = value

    @property
    def runner(self) -> RedisRunner:
        """Return the broker's runner (its server and namespace)."""
        return self.store.runner

    def __repr__(self) -> str:
        return f"<SimpleBrokerDramatiqBroker {self.settings.target.describe()}>"

    # -- queues ---------------------------------------------------------------------------
    def declare_queue(self, queue_name: str) -> None:
        """Declare ``queue_name`` (idempotent); its name must be a storable queue name."""
        if queue_name in self.queues:
            return
        storage_queue(queue_name, 0)
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)
        self.emit_after("declare_queue", queue_name)

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        """Emit a hook; a message whose lease was lost is skipped before any middleware sees it.

        The fence (:class:`~.consumer.LeaseFence`) is not in ``middleware``,
        so the middleware list is exactly what the application built.
        """
        if signal == "process_message":
            self._fence.before_process_message(self, *args, **kwargs)
        super().emit_before(signal, *args, **kwargs)

    def declare_actor(self, actor: Any) -> None:
        """Declare ``actor``; consumers of its queue then read its priority level too."""
        super().declare_actor(actor)
        self._declared += 1

    def get_declared_queues(self) -> set[str]:
        """Return the queues declared so far."""
        return self.queues.copy()

    def priorities(self, queue_name: str) -> list[int]:
        """Return the priorities of ``queue_name``'s declared actors, lowest (first read) first."""
        found = {0}
        for actor in list(self.actors.values()):
            if actor.queue_name == queue_name:
                found.add(int(actor.priority))
        return sorted(found)

    def levels(self, queue_name: str) -> list[str]:
        """Return the storage queues of ``queue_name``, in read order (see :meth:`priorities`)."""
        return [storage_queue(queue_name, priority) for priority in self.priorities(queue_name)]

    # -- sending --------------------------------------------------------------------------
    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Store ``message``; with ``delay`` (ms) it becomes claimable that much later.

        The delay is kept by the storage (on the server's clock): the
        message keeps its queue, and no worker holds it meanwhile.
        """
        queue = q_name(message.queue_name)
        if delay is not None and delay < 0:
            raise ValueError("delay must be >= 0 milliseconds")
        actor = self.actors.get(message.actor_name)
        target = storage_queue(queue, int(actor.priority) if actor is not None else 0)
        self.logger.debug("Enqueueing message %r on queue %r.", message.message_id, queue)
        self.emit_before("enqueue", message, delay)
        key = tasks.index_key(FRAMEWORK, str(message.message_id)) if self.task_index else ""
        with connection_errors():
            self.store.write(target, encode_body(message.encode()), delay, key)
        self.emit_after("enqueue", message, delay)
        return message

    # -- consuming ------------------------------------------------------------------------
    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """Return a consumer of ``queue_name`` (every priority level of its actors)."""
        queue = q_name(queue_name)
        dead = dead_letter_queue(queue)

        def sources() -> list[tuple[str, str | None]]:
            return [(level, dead) for level in self.levels(queue)]

        self.store.queues.add(queue)
        self.store.start_heartbeat()
        return SimpleBrokerConsumer(
            self.store, sources, lambda: self._declared, prefetch, timeout, dead
        )

    # -- whole queues ---------------------------------------------------------------------
    def flush(self, queue_name: str) -> None:
        """Drop the messages of ``queue_name`` (every level, and its dead letters)."""
        queue = q_name(queue_name)
        with connection_errors():
            self.store.flush([*self.levels(queue), dead_letter_queue(queue)])

    def flush_all(self) -> None:
        """Drop the messages of every declared queue."""
        for queue in list(self.queues):
            self.flush(queue)

    def join(
        self, queue_name: str, *, interval: int = JOIN_INTERVAL_MS, timeout: int | None = None
    ) -> None:
        """Wait until ``queue_name`` holds no message that is not acknowledged (tests).

        Pending, delayed and reserved messages count (every priority level).

        Raises:
            QueueJoinTimeout: ``timeout`` ms passed first.

        """
        queue = q_name(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            with connection_errors():
                left = self.store.count(self.levels(queue))
            if left == 0:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)

    def close(self) -> None:
        """Stop the heartbeat and close the idle wake-up connection (the process is stopping).

        What the task statistics counted is sent first.
        """
        if self.task_stats is not None:
            self.task_stats.flush()
        self.store.close()
        # Closed now rather than lingering: a server stopped right after would
        # otherwise log a reconnect warning.
        close_idle_listeners(timeout=1.0)


__all__ = ["ConfigurationError", "SimpleBrokerDramatiqBroker"]
