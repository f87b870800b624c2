"""Dead letters of a stream: what Protean's DLQ tools list, inspect, replay and purge.

A stream ``S`` has two kinds of dead letter, both under the DLQ name
``S:dlq`` that Protean's CLI and Observatory use:

- **Protean's own**: a subscription that exhausts ``max_retries`` publishes
  the message, with ``_dlq_metadata``, to the stream ``S:dlq``; it is an
  entry of that stream's log, ``<prefix>.S-3adlq``.
- **The broker's**: a copy delivered ``MAX_DELIVERIES`` times (nacked
  outside a subscription, or held by consumers that kept dying) is moved,
  same ID, to its group's ``<prefix>.S--<group>--dead`` queue.

``dlq_id`` is, for Protean's entries, the SimpleBroker ID of the entry in
the DLQ stream (as on Redis, where it is the entry's stream ID); for the
broker's, the message's Protean identifier (as on Protean's inline broker).
A message dead in two groups is two entries with one ``dlq_id``: inspect
and replay take the oldest, so replaying it twice replays both.

Replaying a Protean entry republishes it to the target stream (every group
gets it again, as on Protean's Redis provider); replaying a broker dead
letter to its own stream gives it back to its group only, as a fresh copy
with a fresh delivery count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from protean.port.broker import DLQEntry

from .groups import Groups
from .messages import CorruptMessage, deserialize, envelope, envelope_id, open_envelope, serialize
from .names import Layout
from .store import Store, chunks

logger = logging.getLogger("protean_simplebroker")

#: Most entries read from one queue at a time.
_PAGE = 1000

#: Suffix Protean gives DLQ streams.
DLQ_SUFFIX = ":dlq"


@dataclass(frozen=True, slots=True)
class _Source:
    queue: str
    group: str | None  #: None: the DLQ stream's log (Protean's entries)


def _order(entry: DLQEntry) -> int:
    """Return an entry's age key: its ID, or its message's (both are times)."""
    return int(entry.dlq_id) if entry.dlq_id.isdigit() else 0


#: Largest SimpleBroker ID (a signed 64-bit integer).
_MAX_ID = (1 << 63) - 1


def retention_cutoff(min_id: str) -> int:
    """Return the SimpleBroker ID below which entries are older than ``min_id``.

    ``min_id`` is what Protean's DLQ maintenance passes: a Redis stream ID
    ``"<milliseconds>-<seq>"``; a bare integer is taken as a SimpleBroker ID.
    """
    text = str(min_id).strip()
    if "-" in text:
        millis = int(text.partition("-")[0])
        # SimpleBroker IDs: nanosecond clock, low 12 bits a counter.
        return min(_MAX_ID, (millis * 1_000_000 >> 12) << 12)
    return min(_MAX_ID, int(text))


class DeadLetters:
    """The DLQ operations of one broker."""

    def __init__(
        self,
        store: Store,
        layout: Layout,
        groups: Groups,
        publish: Callable[[str, dict[str, Any]], str],
    ) -> None:
        self._store = store
        self._layout = layout
        self._groups = groups
        self._publish = publish

    def _sources(self, dlq_stream: str) -> list[_Source]:
        sources = [_Source(self._layout.log(dlq_stream), None)]
        base = dlq_stream.removesuffix(DLQ_SUFFIX)
        if base != dlq_stream:
            sources += [
                _Source(self._layout.dead(base, group), group)
                for _, group in self._groups.registered(base)
            ]
        return sources

    def _entry(self, dlq_stream: str, source: _Source, body: str, dlq_id: int) -> DLQEntry | None:
        base = dlq_stream.removesuffix(DLQ_SUFFIX)
        try:
            if source.group is None:
                message = deserialize(body)
                meta = message.get("_dlq_metadata") or {}
                return DLQEntry(
                    dlq_id=str(dlq_id),
                    original_id=str(meta.get("original_id", dlq_id)),
                    stream=str(meta.get("original_stream", base)),
                    consumer_group=str(meta.get("consumer_group", "")),
                    payload=message,
                    failure_reason=str(meta.get("failure_reason", "unknown")),
                    failed_at=meta.get("failed_at"),
                    retry_count=int(meta.get("retry_count", 0)),
                    dlq_stream=dlq_stream,
                )
            identifier, message = open_envelope(body)
        except (CorruptMessage, TypeError, ValueError) as exc:
            logger.warning(
                "skipping unreadable dead letter %s in %s: %s", dlq_id, source.queue, exc
            )
            return None
        return DLQEntry(
            dlq_id=identifier,
            original_id=identifier,
            stream=base,
            consumer_group=source.group,
            payload=message,
            failure_reason="max_retries_exceeded",
            failed_at=None,
            retry_count=self._store.deliveries(dlq_id, base, source.group),
            dlq_stream=dlq_stream,
        )

    def _rows(self, source: _Source) -> Iterator[tuple[str, int]]:
        after = None
        while True:
            rows = self._store.peek(source.queue, _PAGE, after=after)
            yield from rows
            if len(rows) < _PAGE:
                return
            after = rows[-1][1]

    def _find(self, dlq_stream: str, dlq_id: str) -> tuple[_Source, str, int] | None:
        """Return the oldest entry ``dlq_id`` names (see the module docstring)."""
        if not dlq_id.isdigit() or len(dlq_id) > 20:
            return None
        wanted = int(dlq_id)
        for source in self._sources(dlq_stream):
            if source.group is None:
                body = self._store.peek_exact(source.queue, wanted)
                if body is not None:
                    return source, body, wanted
                continue
            for body, message_id in self._rows(source):
                if envelope_id(body) == wanted:
                    return source, body, message_id
        return None

    # -- Protean's DLQ API ---------------------------------------------------------------
    def list(self, dlq_streams: list[str], limit: int) -> list[DLQEntry]:
        """Return up to ``limit`` entries of the given DLQ streams, newest first."""
        entries: list[DLQEntry] = []
        for dlq_stream in dlq_streams:
            for source in self._sources(dlq_stream):
                for body, dlq_id in self._rows(source):
                    entry = self._entry(dlq_stream, source, body, dlq_id)
                    if entry is not None:
                        entries.append(entry)
        entries.sort(key=lambda e: (e.failed_at or "", _order(e)), reverse=True)
        return entries[: max(0, limit)]

    def inspect(self, dlq_stream: str, dlq_id: str) -> DLQEntry | None:
        """Return one entry, or None."""
        found = self._find(dlq_stream, str(dlq_id))
        return None if found is None else self._entry(dlq_stream, *found)

    def replay(self, dlq_stream: str, dlq_id: str, target_stream: str) -> bool:
        """Give one entry back (see the module docstring); False when it is not there."""
        found = self._find(dlq_stream, str(dlq_id))
        if found is None:
            return False
        source, body, message_id = found
        return self._replay(dlq_stream, source, body, message_id, target_stream)

    def _replay(
        self, dlq_stream: str, source: _Source, body: str, message_id: int, target: str
    ) -> bool:
        conn = self._store.conn
        base = dlq_stream.removesuffix(DLQ_SUFFIX)
        # Written before the entry is removed: a crash in between replays it
        # twice (at least once) rather than losing it.
        if source.group is not None and target == base:
            queue = self._layout.group(base, source.group)
            identifier, message = open_envelope(body)
            conn.write(queue, envelope(int(identifier), serialize(message)))
            self._store.notify(queue)
        else:
            message = deserialize(body) if source.group is None else open_envelope(body)[1]
            message.pop("_dlq_metadata", None)
            self._publish(target, message)
        conn.delete_message_ids(source.queue, [message_id])
        if source.group is not None:
            self._store.failures.drop(base, source.group, message_id)
        logger.info("replayed dead letter %s of %s to %s", message_id, dlq_stream, target)
        return True

    def replay_all(self, dlq_stream: str, target_stream: str) -> int:
        """Replay every entry; return how many."""
        done = 0
        for source in self._sources(dlq_stream):
            for body, message_id in list(self._rows(source)):
                try:
                    done += self._replay(dlq_stream, source, body, message_id, target_stream)
                except CorruptMessage as exc:
                    logger.warning("not replaying unreadable dead letter %s: %s", message_id, exc)
        return done

    def purge(self, dlq_stream: str) -> int:
        """Delete every entry; return how many."""
        done = 0
        base = dlq_stream.removesuffix(DLQ_SUFFIX)
        for source in self._sources(dlq_stream):
            ids = [message_id for _, message_id in self._rows(source)]
            for part in chunks(ids):
                done += int(self._store.conn.delete_message_ids(source.queue, part))
            if source.group is not None:
                for message_id in ids:
                    self._store.failures.drop(base, source.group, message_id)
        return done

    def trim(self, dlq_stream: str, min_id: str) -> int:
        """Delete entries stored before ``min_id`` (see :func:`retention_cutoff`)."""
        try:
            cutoff = retention_cutoff(min_id)
        except ValueError:
            logger.warning("cannot trim %s: %r is not a stream ID", dlq_stream, min_id)
            return 0
        queues = [source.queue for source in self._sources(dlq_stream)]
        return int(self._store.conn.delete_from_queues(queues, before_timestamp=cutoff))

    def depth(self, dlq_stream: str) -> int:
        """Return how many entries the DLQ holds."""
        queues = {source.queue for source in self._sources(dlq_stream)}
        stats = self._store.conn.list_queue_stats(
            prefix=self._layout.log(dlq_stream.removesuffix(DLQ_SUFFIX))
        )
        return sum(s.pending for s in stats if s.queue in queues)
