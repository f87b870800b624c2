"""The kombu virtual channel: Celery queues as SimpleBroker queues, delivered with leases.

A message a channel hands to Celery is *reserved* (``Leases.reserve``): it
stays in its queue (``broker peek`` shows it) but no other worker can take
it until this one acknowledges it (deleted), rejects it (pending again, or
moved to the dead-letter queue) or hands it back (``basic_recover``, channel
close), or until its lease expires because the worker died. The transport's
heartbeat renews the leases of everything the process holds: messages
reserved ahead of delivery, prefetched and running tasks, and ETA/countdown
tasks the worker keeps until they are due. There is no visibility timeout.

One reservation (one round trip) takes as many messages as the prefetch
window has room for; the ones not yet delivered wait in a per-queue buffer.
Each message's delivery tag is ``"<token>:<id>"``, so acknowledging needs
no lookup. Queues consumed with ``no_ack`` (Celery's pidbox) are claimed
instead. Messages are JSON envelopes (kombu's payload); bodies that are
UTF-8 are stored as text, so ``broker peek celery`` shows readable tasks.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from queue import Empty
from typing import TYPE_CHECKING, Any, Final

from kombu.transport import virtual

from simplebroker_redis import LeasedMessage, ReplicationTimeout, calls
from simplebroker_redis.priorities import priority_queue

from .bindings import Binding
from .errors import UnconfirmedPublish
from .options import storage_queue

if TYPE_CHECKING:
    from .transport import Transport

logger = logging.getLogger("celery_simplebroker")

#: Body encoding: UTF-8 bodies stored as text, others as base64.
AUTO_ENCODING: Final[str] = "text-or-base64"

#: Envelope field holding a message's expiry (epoch seconds), from its ``expiration``.
EXPIRES_FIELD: Final[str] = "sb-expires-at"

#: Messages one purge round trip removes.
PURGE_BATCH: Final[int] = 1000

#: Lease of the reservations a purge deletes at once.
PURGE_LEASE: Final[float] = 60.0

Buffered = tuple[str, LeasedMessage]


def delivery_tag(token: str, message_id: int) -> str:
    """Return the delivery tag of a reserved message."""
    return f"{token}:{message_id}"


def parse_tag(tag: str) -> tuple[str, int]:
    """Return (token, message id) of a delivery tag made by :func:`delivery_tag`."""
    token, _, message_id = str(tag).rpartition(":")
    return token, int(message_id)


def by_token(tags: Iterable[str]) -> dict[str, list[int]]:
    """Group delivery tags by reservation token."""
    return _grouped(parse_tag(tag) for tag in tags)


def reserved_by_token(reserved: Iterable[Buffered]) -> dict[str, list[int]]:
    """Group reserved (token, message) pairs' IDs by reservation token."""
    return _grouped((token, message.id) for token, message in reserved)


def _grouped(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for token, message_id in pairs:
        groups.setdefault(token, []).append(message_id)
    return groups


class QoS(virtual.QoS):
    """Prefetch accounting of kombu, with acks, rejects and restores settled on the server."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        """Delete the message (one round trip), then forget it."""
        self.channel.settle(delivery_tag)
        super().ack(delivery_tag)
        self.channel.transport.nudge()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Requeue (pending again at its place) or dead-letter / delete the message."""
        self.channel.reject_message(delivery_tag, requeue)
        self._quick_ack(delivery_tag)
        self.channel.transport.nudge()

    def restore_unacked(self) -> list[Any]:
        """Hand every unacknowledged message back, one round trip per reservation.

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

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport = connection
        self._buffers: dict[str, deque[Buffered]] = {}
        self._noack: set[str] = set()
        self._auto_delete: set[str] = set()  # auto_delete queues declared on this channel

    # -- bodies -----------------------------------------------------------------
    def encode_body(self, body: Any, encoding: str | None = None) -> tuple[Any, str | None]:
        """Encode a body for the JSON envelope (text when it is UTF-8)."""
        if encoding == AUTO_ENCODING or (encoding == "utf-8" and isinstance(body, bytes)):
            if isinstance(body, str):
                return body, "utf-8"
            try:
                return bytes(body).decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                return base64.b64encode(body).decode("ascii"), "base64"
        encoded: tuple[Any, str | None] = super().encode_body(body, encoding)
        return encoded

    # -- publishing --------------------------------------------------------------
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """Write the message to the queue (one round trip; wakes idle consumers).

        During a chord's dispatch the message is staged instead, and written
        together with the chord's ``done`` mark (see :mod:`.staging`).
        """
        storage = storage_queue(queue)
        if self.transport.options.priorities:
            storage = priority_queue(storage, self._get_message_priority(message))
        with _unconfirmed_is_final():
            self.transport.write(storage, self._envelope(message))

    def _put_fanout(
        self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any
    ) -> None:
        """Write one copy to every queue bound to ``exchange``, atomically (one broadcast)."""
        queues = sorted({storage_queue(queue) for queue in self._lookup(exchange, routing_key)})
        if queues:
            with _unconfirmed_is_final():
                self.transport.core.broadcast(
                    self._envelope(message), queue_names=queues, create_missing=True
                )

    @staticmethod
    def _envelope(message: dict[str, Any]) -> str:
        expiration = message.get("properties", {}).get("expiration")
        if expiration is not None and EXPIRES_FIELD not in message:
            message[EXPIRES_FIELD] = time.time() + float(expiration) / 1000
        return json.dumps(message)

    # -- exchanges and queues ------------------------------------------------------
    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Remember the queue's TTL and lifetime (SimpleBroker queues need no creation)."""
        self.transport.remember_queue(queue, kwargs)
        if kwargs.get("auto_delete"):
            self._auto_delete.add(queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        lifetime = self.transport.queue_lifetime(queue)
        self.transport.bind(Binding(exchange, routing_key, queue, pattern, lifetime))

    def get_table(self, exchange: str) -> list[tuple[str, str | None, str]]:
        """Return the exchange's bindings as every process of the namespace sees them."""
        return [(b.routing_key, b.pattern, b.queue) for b in self.transport.table(exchange)]

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Remove the queue's bindings (every process's) and its unreserved messages."""
        if if_empty and self._size(queue):
            return
        self._release_buffer(queue)
        self.transport.bindings.unbind_queue(queue)
        self._purge(queue)
        self.state.queue_bindings_delete(queue)

    def _purge(self, queue: str) -> int:
        """Delete the queue's messages that nobody holds; return how many."""
        return self.transport.purge(storage_queue(queue))

    def _size(self, queue: str) -> int:
        """Return the queue's ready messages: pending and held by no worker (every priority)."""
        runner = self.transport.runner
        levels = self.transport.levels(storage_queue(queue))
        return runner.run(calls.ready_count(runner.keys, levels))

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
        self.transport.consumers_changed(consuming=True)
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
            if queue in self._auto_delete and queue not in self.transport.consumed_queues():
                self._auto_delete.discard(queue)
                try:
                    self.queue_delete(queue)
                except Exception as exc:  # noqa: BLE001 - its bindings still expire on their own
                    logger.debug("deleting auto_delete queue %s failed: %s", queue, exc)
        self.transport.consumers_changed(consuming=False)
        return result

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        """Change the prefetch window; a waiting consumer may now take more."""
        super().basic_qos(*args, **kwargs)
        self.transport.nudge()

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
        if not self._buffers.get(queue) and self.transport.wakeups.known_empty(
            storage_queue(queue)
        ):
            raise Empty()
        if queue in self._noack:
            return self._claim(queue)
        return self._take(queue, limit=None)

    def buffered(self) -> int:
        """Return how many messages this channel reserved but has not delivered."""
        return sum(len(buffer) for buffer in self._buffers.values())

    def _take(self, queue: str, limit: int | None) -> dict[str, Any]:
        buffer = self._buffers.setdefault(queue, deque())
        while True:
            if not buffer:
                self._reserve(queue, buffer, limit)
            token, message = buffer.popleft()
            payload = self.transport.open_envelope(queue, token, message)
            if payload is not None:
                return payload

    def _reserve(self, queue: str, buffer: deque[Buffered], limit: int | None) -> None:
        if limit is None:
            room = self.qos.can_consume_max_estimate()
            limit = self.transport.options.reserve_batch if room is None else room
            limit -= self.buffered()
        if limit < 1:
            raise Empty()  # the prefetch window is full, not the queue empty
        storage = storage_queue(queue)
        generation = self.transport.wakeups.generation(storage)
        reserved = self.transport.reserve(storage, limit)
        self.took(queue, reserved, limit, generation)
        if not reserved:
            raise Empty()

    def took(self, queue: str, reserved: list[Buffered], limit: int, generation: int) -> None:
        """Buffer a reservation of ``queue`` that asked for ``limit``, begun at ``generation``."""
        storage, wakeups = storage_queue(queue), self.transport.wakeups
        self.transport.reserved_batch(storage, full=len(reserved) == limit)
        if len(reserved) < limit:  # it took every claimable message
            wakeups.found_empty(storage, generation)
        if reserved:
            self._buffers.setdefault(queue, deque()).extend(reserved)

    def room_ahead(self, acked: tuple[str, int]) -> int:
        """Return the prefetch window's room once the acknowledgements queued are sent.

        Counts the delivered messages still held on the server: neither
        acknowledged, nor ``acked``, nor acknowledged by their result's
        script already (the loop sends Celery's acknowledgement of those
        next turn), and the buffered ones.
        """
        qos = self.qos
        if not qos.prefetch_count:
            return self.window() - self.buffered()
        settled = self.transport.settled_with_result
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
        return int(prefetch) if prefetch else self.transport.options.reserve_batch

    def _claim(self, queue: str) -> dict[str, Any]:
        storage, wakeups = storage_queue(queue), self.transport.wakeups
        while True:
            generation = wakeups.generation(storage)
            try:
                payload = self.transport.claim(queue)
            except Empty:
                wakeups.found_empty(storage, generation)
                raise
            if payload is not None:
                return payload

    # -- settling -------------------------------------------------------------------
    def settle(self, tag: str) -> None:
        """Acknowledge one delivered message (deleted from its queue)."""
        self.transport.ack(*parse_tag(tag))

    def reject_message(self, tag: str, requeue: bool) -> None:
        """Requeue one delivered message, or dead-letter (or delete) it."""
        token, message_id = parse_tag(tag)
        if requeue:
            self.transport.release({token: [message_id]}, undeliver=False)
        else:
            self.transport.dead_letter(token, message_id)

    def release_tags(self, tags: Iterable[str]) -> None:
        """Hand delivered messages back (pending again), one round trip per reservation."""
        self.transport.release(by_token(tags), undeliver=False)

    def _release_buffer(self, queue: str) -> None:
        buffer = self._buffers.pop(queue, None)
        if buffer:
            # Never handed to Celery: the delivery does not count.
            self.transport.release(reserved_by_token(buffer), undeliver=True)

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
