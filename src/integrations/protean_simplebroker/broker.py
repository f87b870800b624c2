"""``SimpleBrokerBroker``: Protean's ``BaseBroker`` on SimpleBroker queues.

Configured the Protean way::

    [brokers.default]
    provider = "simplebroker"
    URI = "redis://127.0.0.1:6379/0"     # or "rediss://", "unix://", "redis+cluster://",
                                         # "redis+sentinel://", or a SQLite file path

Publishing appends to the stream's log; each consumer group copies the log
into its own queue (:mod:`.groups`) and its consumers reserve from there
(:mod:`.store`): every group gets every message, in order, and the
consumers of one group share them, each message held by one consumer at a
time. See ``docs/protean.md``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from protean.port.broker import BaseBroker, BrokerCapabilities, DLQEntry, registry
from simplebroker.ext import MessageError, OperationalError

from simplebroker_redis import ReplicationTimeout
from simplebroker_redis.tasks import index_key

from . import config, reports
from .dlq import DeadLetters
from .errors import UnconfirmedPublish, worth_a_retry
from .groups import Groups
from .inflight import InFlight, Taken
from .messages import ENVELOPE_OVERHEAD, log_key, serialize
from .names import Layout
from .reads import take_when_idle
from .store import Store
from .taskformat import FRAMEWORK, message_id, message_type

if TYPE_CHECKING:
    from protean.domain import Domain

logger = logging.getLogger("protean_simplebroker")

#: Longest wait of one blocking read, so a poll loop sees shutdown within a second
#: (the same cap as Protean's Redis Streams provider).
MAX_BLOCK_MS: Final[int] = 1000


def _make_store(settings: config.Settings, layout: Layout) -> Store:
    if settings.backend == "redis":
        from .redis_store import RedisStore  # noqa: PLC0415 - only when asked for

        return RedisStore(settings, layout)
    from .sqlite_store import SqliteStore  # noqa: PLC0415 - only when asked for

    return SqliteStore(settings, layout)


class SimpleBrokerBroker(BaseBroker):
    """A Protean broker on SimpleBroker queues, on Redis or a SQLite file."""

    __broker__ = "simplebroker"

    def __init__(self, name: str, domain: Domain, conn_info: dict[str, str | bool]) -> None:
        super().__init__(name, domain, conn_info)
        self.settings = config.parse(conn_info)
        self.layout = Layout(self.settings.prefix)
        self._store_: Store | None = None
        self._groups_: Groups | None = None
        self._guard = threading.RLock()
        self._handing = threading.Lock()  #: held by a read of an owned group (see _take)
        self._inflight = InFlight()
        self._owned: set[tuple[str, str]] = set()
        self._consumers: dict[str, set[str]] = {}
        self._max_deliveries = self.settings.max_deliveries
        # Read by Protean's health report and its generic tests; informational.
        self._retry_delay = 0.0
        self._message_timeout = self.settings.timing.lease_seconds
        self._enable_dlq = self._max_deliveries is not None

    def __repr__(self) -> str:
        return f"SimpleBrokerBroker({self.name!r}, {self.settings.shown!r})"

    @property
    def _max_retries(self) -> int:
        """Protean's name for ``MAX_DELIVERIES - 1``: nacks a message survives (inline's knob)."""
        return self._max_deliveries - 1 if self._max_deliveries else 0

    @_max_retries.setter
    def _max_retries(self, value: int) -> None:
        self._max_deliveries = max(0, int(value)) + 1
        if self._store_ is not None:
            self._store_.max_deliveries = self._max_deliveries

    @property
    def capabilities(self) -> BrokerCapabilities:
        """Ordered, at-least-once consumer groups; blocking reads; dead letters."""
        return (
            BrokerCapabilities.ORDERED_MESSAGING
            | BrokerCapabilities.BLOCKING_READ
            | BrokerCapabilities.DEAD_LETTER_QUEUE
        )

    # -- backend objects, made on first use and again in a forked child --------------
    @property
    def store(self) -> Store:
        """Return this process's backend store."""
        store = self._store_
        if store is not None and store.belongs_here():
            return store
        with self._guard:
            store = self._store_
            if store is None or not store.belongs_here():
                if store is not None:  # a fork: the parent's reservations are not ours
                    self._inflight.clear()
                store = self._store_ = _make_store(self.settings, self.layout)
                store.max_deliveries = self._max_deliveries
                self._groups_ = Groups(store, self.layout, self.settings.copy_batch)
            return store

    @property
    def groups(self) -> Groups:
        """Return this process's view of the consumer groups."""
        self.store  # noqa: B018 - makes both
        assert self._groups_ is not None
        return self._groups_

    @property
    def dead_letters(self) -> DeadLetters:
        """Return the DLQ operations."""
        # A replay publishes a message again on purpose: no idempotency key.
        return DeadLetters(self.store, self.layout, self.groups, self._append)

    # -- publishing ---------------------------------------------------------------------
    def _publish(self, stream: str, message: dict[str, Any]) -> str:
        """Append ``message`` to the stream's log; return its SimpleBroker ID as a string.

        Idempotent by the message's ID (``metadata.headers.id``): published
        again within ``DEDUPE_SECONDS`` (by Protean's own retry after a
        connection error, or by the caller after ``OutcomeUnknown`` or
        ``UnconfirmedPublish``: stored on the primary, no replica confirmed
        it in time), it is stored once and the first ID is returned.
        """
        return self._append(stream, message, dedupe=True)

    def _append(self, stream: str, message: dict[str, Any], *, dedupe: bool = False) -> str:
        """Append ``message`` to the stream's log, idempotent by its ID with ``dedupe``.

        A DLQ replay publishes a message again on purpose: without ``dedupe``.
        """
        body = serialize(message)
        room = self.store.max_message_size - ENVELOPE_OVERHEAD
        if len(body.encode("utf-8")) > room:
            raise MessageError(
                f"message of {len(body.encode('utf-8'))} bytes exceeds the {room} bytes a "
                f"stream message may take (BROKER_MAX_MESSAGE_SIZE minus {ENVELOPE_OVERHEAD})"
            )
        log = self.layout.log(stream)
        own_id = message_id(message)
        key = index_key(FRAMEWORK, own_id) if own_id else ""
        once = log_key(log, own_id) if dedupe else None
        try:
            identifier = self.store.write(log, body, key, dedupe_key=once)
        except ReplicationTimeout as exc:
            if not isinstance(exc.result, int):
                raise
            self.store.notify(log)  # stored on the primary; a failover may lose it
            raise UnconfirmedPublish(stream, str(exc.result)) from exc
        self.store.notify(log)
        if self.store.task_stats is not None:
            self.store.task_stats.enqueued(message_type(message))
        return str(identifier)

    # -- consuming ------------------------------------------------------------------------
    def _take(
        self, stream: str, group: str, count: int, until: float = 0.0
    ) -> list[tuple[str, dict[str, Any]]]:
        """Return up to ``count`` messages for this consumer (:func:`.reads.take_when_idle`)."""
        parts = (self.store, self.groups, self._inflight, self._handing, stream, group, count)
        return take_when_idle(*parts, owned=(stream, group) in self._owned, until=until)

    def _get_next(self, stream: str, consumer_group: str) -> tuple[str, dict[str, Any]] | None:
        """Reserve the group's next message."""
        taken = self._take(stream, consumer_group, 1)
        return taken[0] if taken else None

    def _read(
        self, stream: str, consumer_group: str, no_of_messages: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reserve up to ``no_of_messages`` of the group's next messages."""
        return self._take(stream, consumer_group, no_of_messages)

    def _read_blocking(
        self,
        stream: str,
        consumer_group: str,
        consumer_name: str,
        timeout_ms: int = 5000,
        count: int = 1,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reserve up to ``count`` messages, waiting up to ``timeout_ms`` (capped at 1 s)."""
        return self._read_blocking_streams(
            [stream], consumer_group, consumer_name, timeout_ms, count
        )[stream]

    def _read_blocking_streams(
        self,
        streams: Sequence[str],
        consumer_group: str,
        consumer_name: str,
        timeout_ms: int = 5000,
        count: int = 1,
    ) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """Read the first of ``streams`` (in order) that has messages, waiting on all at once."""
        # Worded without "timeout": Protean's base class would take that for
        # a connection error, reconnect and try again.
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
            raise ValueError(f"a blocking read waits a number of milliseconds, not {timeout_ms!r}")
        if not timeout_ms >= 0:  # also refuses NaN
            raise ValueError(f"a blocking read waits >= 0 ms, not {timeout_ms!r}")
        result: dict[str, list[tuple[str, dict[str, Any]]]] = {stream: [] for stream in streams}
        if not streams:
            return result
        with self._guard:
            self._consumers.setdefault(consumer_group, set()).add(consumer_name)
        queues = [
            q for s in streams for q in (self.layout.log(s), self.layout.group(s, consumer_group))
        ]
        waiter = self.store.waiter(queues) if timeout_ms else None
        deadline = time.monotonic() + min(timeout_ms, MAX_BLOCK_MS) / 1000
        while True:
            for stream in streams:
                taken = self._take(stream, consumer_group, count, until=deadline)
                if taken:
                    result[stream] = taken
                    return result
            remaining = deadline - time.monotonic()
            if waiter is None or remaining <= 0 or self.store.stop.is_set():
                return result
            waiter.wait(remaining)

    # -- settling ---------------------------------------------------------------------------
    def _ack(self, stream: str, identifier: str, consumer_group: str) -> bool:
        """Consume a message this consumer holds; False when it holds none of that name."""
        key = (stream, consumer_group)
        taken = self._inflight.get(key, identifier)
        if taken is None:
            return False
        try:
            done = self.store.ack(taken.held)
        finally:
            # Protean never retries an ack: a failed one lets the copy go (issue 42).
            self._inflight.drop(key, identifier)
        self._count_run(taken, ok=True)
        if not done:
            logger.warning(
                "message %s of %s for group %s: its reservation expired before the "
                "acknowledgement; it may be handled again",
                identifier,
                stream,
                consumer_group,
            )
        return done

    def _nack(self, stream: str, identifier: str, consumer_group: str) -> bool:
        """Keep the message for this consumer's next read, or dead-letter it past the limit.

        Outside a Protean subscription the nack counts as a failed delivery:
        the message's ``MAX_DELIVERIES``-th goes to the group's dead letters.
        """
        key = (stream, consumer_group)
        taken = self._inflight.get(key, identifier)
        if taken is None:
            return False
        self._count_run(taken, ok=False)
        most = self._max_deliveries
        if key not in self._owned and most is not None:
            failed = taken.held.deliveries + self.store.recorded_failures(taken.held)
            if failed >= most:
                buried = self.store.bury(taken.held, deliveries=failed)
                self._inflight.drop(key, identifier)
                logger.warning(
                    "message %s of %s dead-lettered for group %s after %d deliveries",
                    identifier,
                    stream,
                    consumer_group,
                    failed,
                )
                return buried
        self._inflight.redeliver(key, identifier)
        stats = self.store.task_stats
        if stats is not None:
            stats.retried(message_type(taken.payload))
        return True

    def _count_run(self, taken: Taken, *, ok: bool) -> None:
        """Count a handled message in the task statistics: done (acked) or failed (nacked)."""
        stats = self.store.task_stats
        if stats is not None:
            seconds = time.perf_counter() - taken.started
            stats.finished(message_type(taken.payload), seconds, ok=ok)

    # -- groups -----------------------------------------------------------------------------
    def _ensure_group(self, group_name: str, stream: str | None = None) -> None:
        """Register the group on ``stream`` (idempotent, from any process)."""
        if stream is None:
            raise ValueError("the simplebroker broker needs the stream of a consumer group")
        self.groups.ensure(stream, group_name)

    def _mark_subscription_owned(self, stream: str, consumer_group: str) -> None:
        """Note that a Protean subscription retries and dead-letters this group's messages.

        Its nacks then do not count toward ``MAX_DELIVERIES``: only deliveries
        whose consumer died do, so a message that keeps killing its consumer
        still ends in the dead letters.
        """
        with self._guard:
            self._owned.add((stream, consumer_group))

    def _info(self) -> dict[str, Any]:
        """Return every registered group, its backlog and creation time."""
        with self._guard:
            consumers = {group: set(names) for group, names in self._consumers.items()}
        return {
            "consumer_groups": reports.consumer_groups(
                self.store, self.layout, self.groups, consumers
            )
        }

    def trim(self, stream: str, maxlen: int) -> int:
        """Keep at most ``maxlen`` log entries, never one a group has not copied."""
        return self.groups.trim(stream, maxlen)

    # -- health ------------------------------------------------------------------------------
    def _ping(self) -> bool:
        return self.store.ping()

    def _is_connection_error(self, exception: Exception) -> bool:
        """Return whether Protean's ``publish`` PINGs and retries (not after a timeout)."""
        return worth_a_retry(exception) and bool(super()._is_connection_error(exception))

    def _ensure_connection(self) -> bool:
        try:
            return self.store.ping()
        except (OperationalError, OSError) as exc:
            logger.warning("%s does not answer: %s", self.settings.shown, exc)
            return False

    def _calculate_message_counts(self) -> dict[str, int]:
        return reports.message_counts(self.store, self.layout)

    def _calculate_streams_info(self) -> dict[str, Any]:
        return reports.streams(self.store, self.layout)

    def _calculate_consumer_groups_info(self) -> dict[str, Any]:
        return reports.group_names(self.groups)

    def _health_stats(self) -> dict[str, Any]:
        """Return counts, streams, groups, storage size and settings."""
        healthy = True
        try:
            memory = self.store.memory_bytes()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            healthy, memory = False, 0
            logger.debug("health: storage size unknown: %s", exc)
        return {
            "healthy": healthy,
            "backend": self.settings.backend,
            "target": self.settings.shown,
            "message_counts": reports.section("message_counts", self._calculate_message_counts),
            "streams": reports.section("streams", self._calculate_streams_info),
            "consumer_groups": reports.section(
                "consumer_groups", self._calculate_consumer_groups_info
            ),
            "memory_estimate_bytes": int(memory),
            "configuration": {
                "broker_type": f"simplebroker_{self.settings.backend}",
                "queue_prefix": self.settings.prefix,
                "max_deliveries": self._max_deliveries,
                "max_retries": self._max_retries,
                "retry_delay": self._retry_delay,
                "message_timeout": self._message_timeout,
                "enable_dlq": self._enable_dlq,
                **self.store.details(),
            },
        }

    # -- dead letters ---------------------------------------------------------------------------
    def _dlq_list(self, dlq_streams: list[str], limit: int) -> list[DLQEntry]:
        return self.dead_letters.list(dlq_streams, limit)

    def _dlq_inspect(self, dlq_stream: str, dlq_id: str) -> DLQEntry | None:
        return self.dead_letters.inspect(dlq_stream, dlq_id)

    def _dlq_replay(self, dlq_stream: str, dlq_id: str, target_stream: str) -> bool:
        return self.dead_letters.replay(dlq_stream, dlq_id, target_stream)

    def _dlq_replay_all(self, dlq_stream: str, target_stream: str) -> int:
        return self.dead_letters.replay_all(dlq_stream, target_stream)

    def _dlq_purge(self, dlq_stream: str) -> int:
        return self.dead_letters.purge(dlq_stream)

    def dlq_trim(self, dlq_stream: str, min_id: str) -> int:
        """Delete DLQ entries older than ``min_id`` (Protean's DLQ maintenance)."""
        return self.dead_letters.trim(dlq_stream, min_id)

    def dlq_depth(self, dlq_stream: str) -> int:
        """Return how many entries the DLQ holds."""
        return self.dead_letters.depth(dlq_stream)

    # -- lifecycle -----------------------------------------------------------------------------
    def _data_reset(self) -> None:
        """Delete every queue of this provider (its prefix) and forget what is held here."""
        store = self.store
        store.forget_holdings()
        self._inflight.clear()
        names = store.conn.list_queues(prefix=self.layout.all_prefix)
        for name in names:
            try:
                store.conn.delete(name)
            except OperationalError as exc:  # held by a live consumer elsewhere
                logger.warning("could not delete %s: %s", name, exc)
        self.groups.forget()

    def close(self) -> None:
        """Hand back what this process holds, stop its threads, close connections."""
        with self._guard:
            store, self._store_, self._groups_ = self._store_, None, None
        self._inflight.clear()
        if store is not None:
            try:
                if store.task_stats is not None:
                    store.task_stats.flush()
                store.close()
            except Exception:  # closing must not raise during shutdown; logged
                logger.exception("closing broker %s failed", self.name)


def register() -> None:
    """Register the provider with Protean (entry point ``protean.brokers``: ``simplebroker``)."""
    registry.register("simplebroker", "protean_simplebroker.broker.SimpleBrokerBroker")
