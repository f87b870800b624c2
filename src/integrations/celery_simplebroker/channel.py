"""The kombu virtual channel: Celery queues as SimpleBroker queues, delivered with leases.

A channel implements kombu's storage hooks (``_put``, ``_get``, ``_purge``,
``_size``, ``_new_queue``, ...) on its transport's :class:`~.store.Store`,
and tells the transport's :class:`~.poller.Poller` what it consumes.

One reservation (one round trip) takes as many messages as the prefetch
window has room for; the ones not yet delivered wait in a per-queue buffer
under the heartbeat's renewals. Queues consumed with ``no_ack`` (Celery's
pidbox) are claimed instead. Messages are JSON envelopes (:mod:`.envelope`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from queue import Empty
from typing import Any

from kombu.transport import virtual

from simplebroker_redis import ReplicationTimeout
from simplebroker_redis.holdings import Standing

from . import publishing
from .bindings import Declarations
from .envelope import (
    AUTO_ENCODING,
    Buffered,
    Tag,
    by_token,
    encode_body,
    parse_tag,
    reserved_by_token,
    seal,
)
from .errors import UnconfirmedPublish
from .options import storage_queue
from .poller import Poller
from .store import Store
from .taskformat import task_headers

logger = logging.getLogger("celery_simplebroker")

#: Standings of a delivered message whose lease may no longer be this worker's.
_STALE = frozenset({Standing.EXPIRED, Standing.LOST})


class QoS(virtual.QoS):
    """Prefetch accounting of kombu, with acks, rejects and restores settled on the server."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        """Delete the message (one round trip), then forget it, whatever the server said.

        Celery acknowledges a message once: a tag kept here after a failed
        settlement would hold its prefetch slot for good, and a worker that
        lost every slot so (a reset of every connection) took nothing more
        (issue 42). The store sends again what could not reach the server
        (:mod:`.settlements`).
        """
        try:
            self.channel.settle(delivery_tag)
        finally:
            super().ack(delivery_tag)
            self.channel.poller.nudge()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Requeue (pending again at once, at its place) or dead-letter / delete the message.

        The slot is freed whatever the server said, as for :meth:`ack`.
        """
        try:
            self.channel.reject_message(delivery_tag, requeue)
        finally:
            self._quick_ack(delivery_tag)
            self.channel.poller.nudge()

    def restore_unacked(self) -> list[Any]:
        """Hand every unacknowledged message back at once, one round trip per reservation.

        Each reservation's messages are released atomically. A failure is
        logged, not dumped: those messages come back when their lease expires.
        """
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        self.channel.release_tags(tags)
        return []


class Channel(virtual.Channel):
    """A kombu channel on SimpleBroker queues."""

    QoS = QoS
    supports_fanout = True
    body_encoding = AUTO_ENCODING

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        # The transport's parts this channel uses (kombu passes the transport).
        self.store: Store = connection.store
        self.poller: Poller = connection.poller
        self.declared: Declarations = connection.declared
        self._buffers: dict[str, deque[Buffered]] = {}
        self._noack: set[str] = set()
        self._auto_delete: set[str] = set()  # auto_delete queues declared on this channel

    # -- what the poller reads (poller.Consumer) -----------------------------------------
    def consuming(self) -> bool:
        """Return True when the channel has a consumer (checked at every turn of the loop)."""
        return bool(self._consumers)

    def consumed_queues(self) -> dict[str, bool]:
        """Return the Celery queues consumed -> True when consumed with acknowledgements.

        Empty when the channel has no consumer. A snapshot: the heartbeat
        thread calls it while the consumer's thread changes consumers.
        """
        if not self._consumers:
            return {}
        return {queue: queue not in self._noack for queue in list(self._active_queues)}

    def can_take_more(self) -> bool:
        """Return True when the prefetch window has room."""
        return bool(self.qos.can_consume())

    def stale_delivered(self) -> dict[str, Standing]:
        """Return the tokens of delivered, unacknowledged messages whose lease may have run out.

        Each with its standing (``EXPIRED`` or ``LOST``). Called by the event
        loop while other threads settle messages (a threads pool acknowledges
        in its own threads, a result's script too): a message whose token
        this process let go of (``LET_GO``: settled, being settled by its
        result's script, or handed back, its tag not out of kombu's
        ``_delivered`` yet), already acknowledged (in kombu's dirty set) or
        settled by its result's script is left out.
        """
        qos = self.qos
        standing, settled = self.store.holdings.standing, self.store.acks.settled
        stale: dict[str, Standing] = {}
        for tag in list(qos._delivered):
            if tag in qos._dirty:
                continue
            try:
                message = parse_tag(tag)
            except ValueError:
                continue
            found = standing(message[0])
            if found in _STALE and not settled(message):
                stale[message[0]] = found
        return stale

    def buffered(self) -> int:
        """Return how many messages this channel reserved but has not delivered."""
        return sum(len(buffer) for buffer in self._buffers.values())

    # -- bodies -----------------------------------------------------------------
    def encode_body(self, body: Any, encoding: str | None = None) -> tuple[Any, str | None]:
        """Encode a body for the JSON envelope (text when it is UTF-8)."""
        return encode_body(body, encoding, super().encode_body)

    # -- publishing --------------------------------------------------------------
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """Write the message to the queue (one round trip; wakes idle consumers).

        During a chord's dispatch the message is staged instead, and written
        together with the chord's ``done`` mark (see :mod:`.staging`).
        """
        storage = self.store.level_of(storage_queue(queue), self._get_message_priority(message))
        once = publishing.dedupe_key(message, storage)
        with _unconfirmed_is_final(), publishing.attempt(message):
            self.store.write(
                storage,
                seal(message, publishing.TRANSIENT_FIELDS),
                task_headers(message),
                dedupe_key=once,
            )

    def prepare_message(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Prepare a message to publish with its idempotency key (see :mod:`.publishing`).

        kombu prepares the message again for every try of a publish, from
        the same properties and headers: the key an earlier try put there
        is kept.
        """
        message: dict[str, Any] = super().prepare_message(*args, **kwargs)
        publishing.begin(message)
        # Before kombu declares the queue: no new try once publish_timeout has passed.
        publishing.check_deadline(
            message, self.store.options.publish_timeout, self.store.runner.where
        )
        return message

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> Any:
        """Publish ``message``, idempotently: its retries never store a second copy.

        The publish's key stays in the message's dicts until every queue it
        is routed to stored it.
        """
        if publishing.PUBLISH_FIELD not in message.get("properties", {}):
            publishing.begin(message)  # not prepared by this channel
        result = super().basic_publish(message, exchange, routing_key, **kwargs)
        publishing.done(message)
        return result

    def queue_declare(self, *args: Any, **kwargs: Any) -> Any:
        """Declare a queue (kombu does before every try of a publish; see :mod:`.publishing`)."""
        publishing.check_declaring(self.store.options.publish_timeout, self.store.runner.where)
        with publishing.preparing():
            return super().queue_declare(*args, **kwargs)

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any
    ) -> None:
        """Write one copy to every queue bound to ``exchange``, atomically (one broadcast)."""
        queues = sorted({storage_queue(queue) for queue in self._lookup(exchange, routing_key)})
        if queues:
            with _unconfirmed_is_final():
                self.store.broadcast(seal(message, publishing.TRANSIENT_FIELDS), queues)

    # -- exchanges and queues ------------------------------------------------------
    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Remember the queue's TTL and lifetime (SimpleBroker queues need no creation)."""
        self.declared.declare_queue(queue, kwargs)
        if kwargs.get("auto_delete"):
            self._auto_delete.add(queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        self.declared.bind(exchange, routing_key, pattern, queue)

    def get_table(self, exchange: str) -> list[tuple[str, str | None, str]]:
        """Return the exchange's bindings as every process of the namespace sees them.

        Bindings that expired (their consumer died) are removed by the
        lookup, and their queues' messages deleted here.
        """
        live, removed = self.declared.bindings.table(exchange)
        for binding in removed:
            try:
                self.store.purge(storage_queue(binding.queue))
            except Exception as exc:  # noqa: BLE001 - a later lookup need not fail for it
                logger.debug("purging expired queue %s failed: %s", binding.queue, exc)
        return [(b.routing_key, b.pattern, b.queue) for b in live]

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Remove the queue's bindings (every process's) and its unreserved messages."""
        if if_empty and self._size(queue):
            return
        self._release_buffer(queue)
        self.declared.bindings.unbind_queue(queue)
        self._purge(queue)
        self.state.queue_bindings_delete(queue)

    def _purge(self, queue: str) -> int:
        """Delete the queue's messages that nobody holds; return how many."""
        return self.store.purge(storage_queue(queue))

    def _size(self, queue: str) -> int:
        """Return the queue's ready messages: pending and held by no worker (every priority)."""
        return self.store.ready(storage_queue(queue))

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        """Return True: a SimpleBroker queue exists implicitly."""
        return True

    # -- consuming ----------------------------------------------------------------
    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        """Consume ``queue``; ``no_ack`` queues are claimed rather than reserved."""
        if no_ack:
            self._noack.add(queue)
        else:
            self._noack.discard(queue)
        result = super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        self.poller.consumers_changed(consuming=True)
        return result

    def consumes_without_ack(self) -> bool:
        """Return True when this channel consumes a queue without acknowledgements (pidbox)."""
        return bool(self._noack)

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Stop consuming; messages reserved but not delivered go back at once.

        An ``auto_delete`` queue declared on this channel is deleted (its
        bindings and messages) once no channel of the process consumes it,
        as AMQP deletes one with its last consumer: a stopped worker's event
        and mailbox queues do not linger until their bindings expire.
        """
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._release_buffer(queue)
            self._noack.discard(queue)
            if queue in self._auto_delete and queue not in self.poller.consumed_queues():
                self._auto_delete.discard(queue)
                try:
                    self.queue_delete(queue)
                except Exception as exc:  # noqa: BLE001 - its bindings still expire on their own
                    logger.debug("deleting auto_delete queue %s failed: %s", queue, exc)
        self.poller.consumers_changed(consuming=False)
        return result

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        """Change the prefetch window; a waiting consumer may now take more."""
        super().basic_qos(*args, **kwargs)
        self.poller.nudge()

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """Take one message now (reserved, or claimed with ``no_ack``)."""
        try:
            raw = self._claim(queue) if no_ack else self._take(queue, limit=1)
        except Empty:
            return None
        message = self.Message(raw, channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # A queue found empty stays empty until its wake-up: no round trip for it.
        if not self._buffers.get(queue) and self.poller.wakeups.known_empty(storage_queue(queue)):
            raise Empty()
        if queue in self._noack:
            return self._claim(queue)
        return self._take(queue, limit=None)

    def _take(self, queue: str, limit: int | None) -> dict[str, Any]:
        buffer = self._buffers.setdefault(queue, deque())
        while True:
            if not buffer:
                self._reserve(queue, limit)
            token, message = buffer.popleft()
            payload = self.store.deliverable(queue, token, message, self.declared.ttl(queue))
            if payload is not None:
                return payload

    def _reserve(self, queue: str, limit: int | None) -> None:
        if limit is None:
            room = self.qos.can_consume_max_estimate()
            limit = self.store.options.reserve_batch if room is None else room
            limit -= self.buffered()
        if limit < 1:
            raise Empty()  # the prefetch window is full, not the queue empty
        storage = storage_queue(queue)
        generation = self.poller.wakeups.generation(storage)
        reserved = self.store.reserve(storage, limit)
        self.took(queue, reserved, limit, generation)
        if not reserved:
            raise Empty()

    def took(self, queue: str, reserved: list[Buffered], limit: int, generation: int) -> None:
        """Buffer a reservation of ``queue`` that asked for ``limit``, begun at ``generation``."""
        storage = storage_queue(queue)
        self.poller.reserved_batch(storage, full=len(reserved) == limit)
        if len(reserved) < limit:  # it took every claimable message
            self.poller.wakeups.found_empty(storage, generation)
        if reserved:
            self._buffers.setdefault(queue, deque()).extend(reserved)

    def room_ahead(self, acked: Tag) -> int:
        """Return the prefetch window's room once the acknowledgements queued are sent.

        Counts the delivered messages still held on the server: neither
        acknowledged, nor ``acked``, nor acknowledged by their result's
        script already (the loop sends Celery's acknowledgement of those
        next turn), and the buffered ones.
        """
        qos = self.qos
        if not qos.prefetch_count:
            return self.window() - self.buffered()
        settled = self.store.acks.settled
        held = 0
        for tag in list(qos._delivered):
            if tag in qos._dirty:
                continue
            message = parse_tag(tag)
            if message != acked and not settled(message):
                held += 1
        return self.window() - held - self.buffered()

    def window(self) -> int:
        """Return how many messages the channel may hold: the prefetch count, else a batch."""
        prefetch = self.qos.prefetch_count
        return int(prefetch) if prefetch else self.store.options.reserve_batch

    def _claim(self, queue: str) -> dict[str, Any]:
        storage, wakeups = storage_queue(queue), self.poller.wakeups
        while True:
            generation = wakeups.generation(storage)
            try:
                payload = self.store.claim(queue, self.declared.ttl(queue))
            except Empty:
                wakeups.found_empty(storage, generation)
                raise
            if payload is not None:
                return payload

    # -- settling -------------------------------------------------------------------
    def settle(self, tag: str) -> None:
        """Acknowledge one delivered message (deleted from its queue)."""
        self.store.ack(*parse_tag(tag))

    def reject_message(self, tag: str, requeue: bool) -> None:
        """Requeue one delivered message (pending again at once), or dead-letter (or delete) it."""
        token, message_id = parse_tag(tag)
        if requeue:
            self.store.release({token: [message_id]}, undeliver=False)
        else:
            self.store.dead_letter(token, message_id)

    def release_tags(self, tags: Iterable[str]) -> None:
        """Hand delivered messages back (pending again), one round trip per reservation."""
        self.store.release(by_token(tags), undeliver=False)

    def _release_buffer(self, queue: str) -> None:
        buffer = self._buffers.pop(queue, None)
        if buffer:
            # Never handed to Celery: the delivery does not count.
            self.store.release(reserved_by_token(buffer), undeliver=True)

    def close(self) -> None:
        """Cancel consumers, hand back unacknowledged and buffered messages, close."""
        if not self.closed:
            for queue in list(self._buffers):
                self._release_buffer(queue)
        super().close()


@contextlib.contextmanager
def _unconfirmed_is_final() -> Iterator[None]:
    """Turn a publish's ``ReplicationTimeout`` into :class:`UnconfirmedPublish` (not retried)."""
    try:
        yield
    except ReplicationTimeout as exc:
        raise UnconfirmedPublish(
            f"{exc}; it was not sent again, as a retry would send it twice"
        ) from exc
