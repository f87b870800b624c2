"""``SimpleBrokerTaskiqBroker``: a Taskiq broker whose tasks are SimpleBroker messages.

A kicked task is one SimpleBroker message in the namespace (one round trip),
so ``broker peek <queue>`` shows it. Workers reserve tasks with renewable
leases (at-least-once delivery), see :mod:`.listener`, :mod:`simplebroker_redis.heartbeat`
and :mod:`.runtime` for how they are delivered, kept alive, recovered and
acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from functools import partial
from typing import Any, Final, Self, Unpack

from taskiq import AsyncBroker, AsyncResultBackend, TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.abc.formatter import TaskiqFormatter
from taskiq.acks import AckableMessage
from taskiq.exceptions import TaskRejectedError
from taskiq.message import BrokerMessage

from simplebroker_redis import AsyncMessages, AsyncRedisRunner
from simplebroker_redis.calls import DEFAULT_DEDUPE_SECONDS
from simplebroker_redis.lease_timing import DEFAULT_LEASE_SECONDS, TimingError, lease_timing
from simplebroker_redis.queue_names import storage_queue
from simplebroker_redis.types import DeadLetterEntry

from .connection import DurableServerKeywords, close_runner, open_runner
from .deadletters import report_dead_letter
from .errors import ConfigurationError, check_dedupe_seconds, is_transient
from .eviction import check_server as check_eviction
from .listener import TaskListener
from .result_backend import SimpleBrokerResultBackend
from .routing import label_queue, listened_queues, sources
from .runtime import Runtime
from .sending import delay_seconds, send
from .shards import check_shards, merged, shard_index, shard_runners
from .sizing import SerializeOnce, check_size
from .taskstats import Tracking

logger = logging.getLogger("taskiq_simplebroker")

#: Most tasks one listener holds at once (reserved and not yet acknowledged).
DEFAULT_PREFETCH: Final[int] = 20

#: Deliveries after which a task that never finished goes to the dead-letter queue.
DEFAULT_MAX_DELIVERIES: Final[int] = 5


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1")
    return value


class SimpleBrokerTaskiqBroker(AsyncBroker):
    """Taskiq broker on simplebroker-redis: leases, heartbeat, delays, dead letters.

    Args:
        url: ``redis://``/``rediss://``/``unix://``/``redis+cluster://``/
            ``redis+sentinel://`` URL. Default:
            ``$SIMPLEBROKER_REDIS_URL``, else the target and namespace of the
            project's ``.broker.toml`` (see :mod:`.connection`).
        queue: Queue of the tasks (a task's ``queue_name`` label routes it
            elsewhere). ``queue_name`` is accepted too (taskiq-redis). Any
            name taskiq-redis takes (``taskiq:queue``): one SimpleBroker
            refuses is stored escaped (``taskiq-3Aqueue``; see :mod:`.routing`).
        queues: Several queues a worker listens on, in strict order (all
            the first one holds before any of the second's); tasks go to the
            first unless labelled ``queue_name``. Instead of ``queue``.
        priorities: Honour ``priority`` labels 0-9 (see :mod:`.routing`):
            workers also read ``<queue>.p1`` .. ``<queue>.p9``, highest first.
        prefetch: Most tasks a worker reserves ahead of Taskiq (fetched, not
            yet handed to it); also the most it reserves in one round trip.
            How many run at once is ``taskiq worker --max-async-tasks``.
        lease_seconds: Lifetime of a reservation without renewal (default 10).
        heartbeat_interval: Seconds between renewals; at most half the
            lease (default a quarter of it, at most 2).
        recover_interval: Seconds between recovery passes for expired leases
            (default ``heartbeat_interval``, at most 1). A killed worker's
            tasks run again within the lease and this (11 s by default).
        max_deliveries: Deliveries after which an unfinished task goes to the
            dead-letter queue, with an error result saying so (None:
            redeliver forever).
        dead_letter_queue: Queue for dead letters (default ``<queue>.dead``
            for each listened queue; given, it serves them all).
        allow_eviction: Start even if the server's ``maxmemory-policy`` is
            ``allkeys-*`` (it may then evict queued tasks).
        result_backend: Taskiq's result backend (or use ``with_result_backend``).
        task_id_generator: Taskiq's task ID generator.
        shards: Spread the queue over this many namespaces (hash slots, so
            cluster nodes); see :mod:`.shards`. 1: the namespace itself.
        task_index: Index each sent task under its task id, so the
            dashboard finds it (default on; ``SIMPLEBROKER_REDIS_TASK_INDEX=0``
            turns it off where not given).
        task_stats: Count tasks sent and runs finished per task name for
            the dashboard and the exporter (default on;
            ``SIMPLEBROKER_REDIS_TASK_STATS=0`` turns it off where not given).
        dedupe_seconds: How long a kicked task's idempotency key keeps the
            same task sent again from being stored twice (600; see
            :mod:`.sending`). None: no key.
        server: Where to connect (the keywords of
            :class:`~.connection.DurableServerKeywords`, which the result
            backend takes too):

            - ``runner``: an existing
              :class:`~simplebroker_redis.AsyncRedisRunner` to share
              (with a result backend or schedule source) instead of ``url``;
            - ``namespace``: SimpleBroker namespace (default: the
              ``.broker.toml``'s when the server comes from there, else the
              backend's default);
            - ``max_connections``: size of the connection pool (default 50,
              or the ``.broker.toml``'s); ``max_connection_pool_size`` is
              accepted too;
            - ``wait_replicas``, ``wait_timeout``, ``wait_aof``: durability
              backend options (WAIT/WAITAOF after every state change);
              default: the project's;
            - ``sentinel_password``: password of the sentinels
              (``redis+sentinel://``);
            - redis-py connection options (``socket_timeout``, ``username``,
              ``password``, ``ssl_*``...: :data:`.connection.URL_OPTIONS`).

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        queue: str | None = None,
        queue_name: str | None = None,
        queues: Sequence[str] | None = None,
        priorities: bool = True,
        prefetch: int = DEFAULT_PREFETCH,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_interval: float | None = None,
        recover_interval: float | None = None,
        max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
        dead_letter_queue: str | None = None,
        allow_eviction: bool = False,
        result_backend: AsyncResultBackend[Any] | None = None,
        task_id_generator: Callable[[], str] | None = None,
        shards: int = 1,
        task_index: bool | None = None,
        task_stats: bool | None = None,
        dedupe_seconds: float | None = DEFAULT_DEDUPE_SECONDS,
        **server: Unpack[DurableServerKeywords],
    ) -> None:
        super().__init__(result_backend=result_backend, task_id_generator=task_id_generator)
        #: Seconds a kicked task's key keeps a resend from storing it twice (None: off).
        self.dedupe_seconds = check_dedupe_seconds(dedupe_seconds)
        self.runner, _ = open_runner(url, server, owner=type(self))
        #: The queues a worker listens on, in order; tasks go to the first.
        self.queues = listened_queues(queue, queue_name, queues)
        self.queue = self.queues[0]
        self.priorities = bool(priorities)
        self.shards = check_shards(shards)
        #: One runner per shard (``[runner]`` unsharded); see :mod:`.shards`.
        self.shard_runners = shard_runners(self.runner, self.shards)
        self.prefetch = _count("prefetch", prefetch)
        try:
            self.timing = lease_timing(lease_seconds, heartbeat_interval, recover_interval)
        except TimingError as exc:
            raise ConfigurationError(str(exc)) from None
        self.max_deliveries = (
            None if max_deliveries is None else _count("max_deliveries", max_deliveries)
        )
        dead = None if dead_letter_queue is None else storage_queue(dead_letter_queue)
        #: Each listened queue's dead-letter queue (stored names).
        self.dead_letter_queues = {q: dead or f"{q}.dead" for q in self.queues}
        self.dead_letter_queue = self.dead_letter_queues[self.queue]
        #: (queue, dead-letter queue) a worker reserves from, in order.
        self.sources = sources(self.queues, self.dead_letter_queues, priorities=self.priorities)
        self.allow_eviction = bool(allow_eviction)
        self._messages = [AsyncMessages(shard) for shard in self.shard_runners]
        self._runtimes: list[Runtime] = []
        self._unchecked = False  #: a worker started before the server answered
        self.add_middlewares(_RejectionMarker(self), _SendCheck(self))
        #: Task index keys and statistics of the tasks sent (see :mod:`simplebroker_redis.tasks`).
        self.tracking = Tracking(self.runner, index=task_index, stats=task_stats)
        self.add_middlewares(*self.tracking.middlewares())

    @property
    def formatter(self) -> TaskiqFormatter:
        """Return the formatter of tasks (set by Taskiq, or by ``with_formatter``)."""
        return self._formatter

    @formatter.setter
    def formatter(self, formatter: TaskiqFormatter) -> None:
        # Wrapped so that kiq() reuses the serialization its size check made (.sizing).
        self._formatter = (
            formatter if isinstance(formatter, SerializeOnce) else SerializeOnce(formatter)
        )

    def add_middlewares(self, *middlewares: TaskiqMiddleware) -> None:
        """Add Taskiq middlewares; this broker's send check stays the last one.

        It serializes the task to check its size, once for the check and the
        send when no other ``pre_send`` runs after it (see :mod:`.sizing`).
        """
        super().add_middlewares(*middlewares)
        self.middlewares.sort(key=lambda middleware: isinstance(middleware, _SendCheck))

    def with_middlewares(self, *middlewares: TaskiqMiddleware) -> Self:
        """Add Taskiq middlewares and return this broker (see :meth:`add_middlewares`)."""
        self.add_middlewares(*middlewares)
        return self

    def __repr__(self) -> str:
        listened = f"queue={self.queue!r}" if len(self.queues) == 1 else f"queues={self.queues!r}"
        return f"SimpleBrokerTaskiqBroker({self.runner.where}, {listened})"

    async def startup(self) -> None:
        """Run Taskiq's startup hooks, then check the server (see :meth:`check_server`).

        A worker process whose server does not answer yet logs that once and
        starts anyway: its listener waits for the server (no crash loop).
        """
        if self.is_worker_process:
            follow_taskiq_log_level()
        backend = self.result_backend
        if isinstance(backend, SimpleBrokerResultBackend):
            backend.defer_server_check()  # checked below, with the broker's
        await super().startup()
        try:
            await self.check_server()
        except Exception as exc:
            if not (self.is_worker_process and is_transient(exc)):
                raise
            self._unchecked = True
            logger.warning("waiting for the server: %s (tasks start once it answers)", exc)

    async def check_server(self) -> None:
        """Create or validate the namespace and refuse an evicting server.

        Raises:
            EvictionPolicyError: ``maxmemory-policy`` is ``allkeys-*`` and
                ``allow_eviction`` is False (for this broker or its result backend).

        """
        for shard in self.shard_runners:
            await shard.ensure_initialized()
        await check_eviction(
            self.runner, allow_eviction=self.allow_eviction, owner="SimpleBrokerTaskiqBroker"
        )
        backend = self.result_backend
        if isinstance(backend, SimpleBrokerResultBackend):
            if backend.shards != self.shards:
                raise ConfigurationError(
                    f"the result backend has shards={backend.shards}, the broker "
                    f"shards={self.shards}: give both the same"
                )
            await backend.check_server()
        self._unchecked = False

    async def _until_checked(self) -> None:
        if self._unchecked:
            await self.check_server()

    async def kick(self, message: BrokerMessage) -> None:
        """Write the task as one SimpleBroker message (one round trip).

        Labels: ``queue_name`` routes the task to another queue; ``priority``
        (0-9) to that queue's priority queue; ``delay`` (seconds) keeps it
        invisible to workers until it is due.

        Idempotent by the task's ID and content (see :mod:`.sending`).

        Raises:
            LabelError: An invalid ``queue_name``, ``priority`` or ``delay``
                label (checked before, in ``kiq()``, by :class:`_LabelCheck`).
            TaskOutcomeUnknown: The write's reply never came (10 s): the
                task may be queued (``kiq()`` raises ``SendTaskError`` from it).

        """
        labels = message.labels
        queue = label_queue(labels, self.queue, priorities=self.priorities)
        delay = delay_seconds(labels.get("delay"))
        messages = self._messages[shard_index(message.task_id, self.shards)]
        key = self.tracking.key(message.task_id)
        await send(messages, queue, message, delay, task_key=key, dedupe=self.dedupe_seconds)
        self.tracking.sent(message.task_name, labels)

    def listen(self) -> AsyncGenerator[AckableMessage, None]:
        """Return the generator of this worker's tasks (call from the running loop).

        With shards, one listener per shard (each reserving up to
        ``prefetch / shards`` ahead), taken in turn.
        """
        runtimes = self._runtimes_here()
        prefetch = max(1, -(-self.prefetch // self.shards))
        listeners = [
            TaskListener(
                runtime,
                sources=self.sources,
                name=self._description(),
                prefetch=prefetch,
                lease_seconds=self.timing.lease_seconds,
                max_deliveries=self.max_deliveries,
                ready=self._until_checked,
                task_id=self._task_id,
            ).messages()
            for runtime in runtimes
        ]
        if len(listeners) == 1:
            return listeners[0]
        return merged(listeners)  # type: ignore[return-value] # an async generator

    async def shutdown(self) -> None:
        """Send pending acknowledgements and task statistics, hand back held tasks, close."""
        runtimes, self._runtimes = self._runtimes, []
        await self.tracking.flush()  # now, not a few seconds later: a producer is often done
        try:
            for runtime in runtimes:
                if runtime.is_current():
                    await runtime.committer.drain()
            await super().shutdown()
        finally:
            for runtime in runtimes:
                if runtime.is_current():
                    await runtime.close()
                else:
                    runtime.heartbeat.stop()
            for shard in {id(r): r for r in (self.runner, *self.shard_runners)}.values():
                await close_runner(shard)
            backend = self.result_backend
            if isinstance(backend, SimpleBrokerResultBackend) and backend.runner is not self.runner:
                # Closing the runtime may have stored dead-letter results
                # through it after the backend's own shutdown.
                await close_runner(backend.runner)

    def _runtimes_here(self) -> list[Runtime]:
        runtimes = self._runtimes
        if runtimes and all(runtime.is_current() for runtime in runtimes):
            return runtimes
        for runtime in runtimes:
            runtime.heartbeat.stop()
        runtimes = self._runtimes = [
            Runtime(
                shard,
                timing=self.timing,
                dead_letter_queue=self.dead_letter_queue,
                sources=self.sources,
                max_deliveries=self.max_deliveries,
                on_dead_lettered=partial(self._dead_lettered, shard),
            )
            for shard in self.shard_runners
        ]
        attach = getattr(self.result_backend, "attach_runtime", None)
        if callable(attach):
            for runtime in runtimes:
                attach(runtime)
        return runtimes

    def _task_id(self, data: bytes) -> str:
        """Return the task ID of a message the JSON fast path could not read."""
        return str(self.formatter.loads(data).task_id)

    def _description(self) -> str:
        """Return what the worker listens on, for its log."""
        names = ", ".join(self.queues)
        return f"{names} (priorities 0-9)" if self.priorities else names

    async def _dead_lettered(self, shard: AsyncRedisRunner, entry: DeadLetterEntry) -> None:
        """Give a dead-lettered task its error result and log it (once per dead letter).

        ``shard`` is the namespace whose journal holds the entry: the task's
        message and its result live there.
        """
        await report_dead_letter(
            entry,
            runner=shard,
            formatter=self.formatter,
            backend=self.result_backend,
            where=self.runner.where,
            max_deliveries=self.max_deliveries,
        )


def follow_taskiq_log_level() -> None:
    """Give this package's loggers the level ``taskiq worker --log-level`` gave Taskiq's.

    The CLI sets the level of the ``taskiq`` logger itself, not only the
    root logger's; loggers a user configured keep their level.
    """
    level = logging.getLogger("taskiq").level
    if level == logging.NOTSET:
        return
    for name in ("taskiq_simplebroker", "simplebroker_redis"):
        ours = logging.getLogger(name)
        if ours.level == logging.NOTSET:
            ours.setLevel(level)


class _SendCheck(TaskiqMiddleware):
    """Refuses a task that cannot be sent as it is, in ``kiq()`` before it is sent.

    Taskiq turns whatever the broker's ``kick`` raises into a bare
    ``SendTaskError`` ("Cannot send task to the queue"); an error raised in
    ``pre_send`` reaches the caller as it is, reason included. The broker
    keeps this middleware last (see :meth:`SimpleBrokerTaskiqBroker.add_middlewares`).
    """

    def __init__(self, target: SimpleBrokerTaskiqBroker) -> None:
        super().__init__()
        self._target = target

    def pre_send(self, message: TaskiqMessage) -> TaskiqMessage:
        """Raise why ``message`` cannot be sent: its labels, or its size.

        Raises:
            LabelError: An invalid ``queue_name``, ``priority`` or ``delay`` label.
            MessageTooLargeError: The task is larger than ``BROKER_MAX_MESSAGE_SIZE``.

        """
        target = self._target
        label_queue(message.labels, target.queue, priorities=target.priorities)
        delay_seconds(message.labels.get("delay"))
        formatter = target.formatter
        if isinstance(formatter, SerializeOnce):  # always, unless replaced by hand
            limit = target.runner.max_message_size
            check = partial(check_size, limit=limit)
            formatter.dumps_ahead(message, check, keep=self._shapes_last())
        return message

    def _shapes_last(self) -> bool:
        """Return whether no ``pre_send`` of another middleware runs after this one's."""
        middlewares = self._target.middlewares
        after = middlewares[middlewares.index(self) + 1 :] if self in middlewares else []
        return all(type(other).pre_send is TaskiqMiddleware.pre_send for other in after)


class _RejectionMarker(TaskiqMiddleware):
    """Dead-letters the message of a task that called ``context.reject()``."""

    def __init__(self, target: SimpleBrokerTaskiqBroker) -> None:
        super().__init__()
        self._target = target

    def on_error(
        self, message: TaskiqMessage, result: TaskiqResult[Any], exception: BaseException
    ) -> None:
        """Mark the running task's acknowledgement as a rejection."""
        if isinstance(exception, TaskRejectedError):
            # The task's own shard settles it; a mark on the others is never read.
            for runtime in self._target._runtimes:
                if runtime.is_current():
                    runtime.mark_rejected()
