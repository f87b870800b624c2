"""Claim, peek and move: one script call per bounded operation.

A move is a claim that files the message under a target queue instead of
deleting it, so both run through :meth:`RetrievalMixin._take` (no target:
a claim). The public signatures are SimpleBroker's ``BrokerConnection``
protocol (see the comment above ``claim_one``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Unpack

from simplebroker.ext import validate_delivery_guarantee

from .. import calls
from .._sbcompat import PEEK_BATCH_SIZE
from ..types import Row, TakeMode
from ..validation import validate_queue_name
from ._batches import BatchesMixin
from ._selection import Options, select


def _first(rows: list[Row], with_timestamps: bool) -> Row | str:
    return rows[0] if with_timestamps else rows[0][0]


def _one(rows: list[Row], with_timestamps: bool) -> Row | str | None:
    return _first(rows, with_timestamps) if rows else None


def _shape(rows: list[Row], with_timestamps: bool) -> list[Row] | list[str]:
    return rows if with_timestamps else [body for body, _ in rows]


def _positive(limit: int) -> int:
    """Return ``limit``; ValueError when it is below one."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    return limit


def _elsewhere(source_queue: str, target_queue: str) -> str:
    """Return ``target_queue``; ValueError when a move would stay in its queue."""
    if source_queue == target_queue:
        raise ValueError("Source and target queues cannot be the same")
    return target_queue


class RetrievalMixin(BatchesMixin):
    """Exactly-once claim and move, peeks, and the generator front ends."""

    def _take(
        self,
        queue: str,
        target: str | None,
        *,
        with_claimed: bool = False,
        **options: Unpack[Options],
    ) -> list[Row]:
        """Claim (``target`` None) or move the selected messages; committed when this returns."""
        op: TakeMode = "claim" if target is None else "move"
        validate_queue_name(queue)
        self._guard(f"{op} operation")
        if target is not None:
            validate_queue_name(target)
        selection = select(**options)
        maintenance = self._maintenance_spec()
        call = calls.claim(
            queue,
            op,
            target=target or "",
            with_claimed=with_claimed,
            maintenance=maintenance,
            **selection,
        )
        rows = self._run(call)
        self._record_activity(len(rows))
        return rows

    def _takes(
        self,
        queue: str,
        target: str | None,
        at_least_once: bool,
        with_timestamps: bool,
        batch_size: int | None,
        config: Any,
        span: Options,
    ) -> Iterator[Row | str]:
        """Yield taken messages one by one or, ``at_least_once``, in reserved batches.

        ``batch_size`` and ``config`` size the batches; ``span`` bounds the IDs.
        """
        if at_least_once:
            if target is not None:
                validate_queue_name(target)
            batch = span.copy()
            batch["limit"] = self._batch_size(batch_size, config)
            yield from self._reserved_batches(queue, target or "", with_timestamps, **batch)
            return
        while rows := self._take(queue, target, **span):
            yield _first(rows, with_timestamps)

    def _look(
        self, queue: str, *, include_claimed: bool = False, **options: Unpack[Options]
    ) -> list[Row]:
        """Return the selected messages, unchanged."""
        validate_queue_name(queue)
        return self._run(calls.peek(queue, include_claimed=include_claimed, **select(**options)))

    # The public methods below keep the signatures of SimpleBroker's
    # BrokerConnection protocol word for word. Claims, moves and peeks take the
    # same options there, so their parameter lists repeat (the one repetition
    # left in core/); the bodies only check their own arguments and delegate.

    # -- claim ---------------------------------------------------------------
    def claim_one(
        self,
        queue: str,
        *,
        exact_timestamp: int | str | None = None,
        with_timestamps: bool = True,
        order: str = "oldest",
    ) -> Row | str | None:
        """Claim the oldest (or newest, or exact) pending message."""
        return _one(self._take(queue, None, exact=exact_timestamp, order=order), with_timestamps)

    def claim_many(
        self,
        queue: str,
        limit: int,
        *,
        with_timestamps: bool = True,
        delivery_guarantee: str = "exactly_once",
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        order: str = "oldest",
    ) -> list[Row] | list[str]:
        """Claim up to ``limit`` messages; committed before they are returned."""
        validate_delivery_guarantee(delivery_guarantee)
        span = Options(
            limit=_positive(limit), after=after_timestamp, before=before_timestamp, order=order
        )
        return _shape(self._take(queue, None, **span), with_timestamps)

    def claim_generator(
        self,
        queue: str,
        *,
        with_timestamps: bool = True,
        delivery_guarantee: str = "exactly_once",
        batch_size: int | None = None,
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        exact_timestamp: int | str | None = None,
        config: Any = None,
    ) -> Iterator[Row | str]:
        """Yield claimed messages; ``at_least_once`` commits whole batches."""
        at_least_once = validate_delivery_guarantee(delivery_guarantee) == "at_least_once"
        span = Options(after=after_timestamp, before=before_timestamp, exact=exact_timestamp)
        yield from self._takes(
            queue, None, at_least_once, with_timestamps, batch_size, config, span
        )

    # -- peek ----------------------------------------------------------------
    def peek_one(
        self,
        queue: str,
        *,
        exact_timestamp: int | str | None = None,
        with_timestamps: bool = True,
        include_claimed: bool = False,
        order: str = "oldest",
    ) -> Row | str | None:
        """Return one message without claiming it."""
        rows = self._look(
            queue, exact=exact_timestamp, include_claimed=include_claimed, order=order
        )
        return _one(rows, with_timestamps)

    def peek_many(
        self,
        queue: str,
        limit: int = PEEK_BATCH_SIZE,
        *,
        with_timestamps: bool = True,
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        include_claimed: bool = False,
        order: str = "oldest",
    ) -> list[Row] | list[str]:
        """Return up to ``limit`` messages without claiming them."""
        span = Options(
            limit=_positive(limit), after=after_timestamp, before=before_timestamp, order=order
        )
        return _shape(self._look(queue, include_claimed=include_claimed, **span), with_timestamps)

    def peek_generator(
        self,
        queue: str,
        *,
        with_timestamps: bool = True,
        batch_size: int | None = None,
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        exact_timestamp: int | str | None = None,
        include_claimed: bool = False,
    ) -> Iterator[Row | str]:
        """Yield messages page by page (ID cursor), without claiming them."""
        page = batch_size if batch_size is not None else PEEK_BATCH_SIZE
        span = Options(
            limit=page, after=after_timestamp, before=before_timestamp, exact=exact_timestamp
        )
        while True:
            rows = self._look(queue, include_claimed=include_claimed, **span)
            for row in rows:
                yield row if with_timestamps else row[0]
            if exact_timestamp is not None or len(rows) < page or not rows:
                return
            span["after"] = rows[-1][1]

    # -- move ----------------------------------------------------------------
    def move_one(
        self,
        source_queue: str,
        target_queue: str,
        *,
        exact_timestamp: int | str | None = None,
        require_unclaimed: bool = True,
        with_timestamps: bool = True,
        order: str = "oldest",
    ) -> Row | str | None:
        """Move one message to ``target_queue`` keeping its ID."""
        target = _elsewhere(source_queue, target_queue)
        span = Options(exact=exact_timestamp, order=order)
        rows = self._take(source_queue, target, with_claimed=not require_unclaimed, **span)
        return _one(rows, with_timestamps)

    def move_many(
        self,
        source_queue: str,
        target_queue: str,
        limit: int,
        *,
        with_timestamps: bool = True,
        delivery_guarantee: str = "exactly_once",
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        require_unclaimed: bool = True,
        order: str = "oldest",
    ) -> list[Row] | list[str]:
        """Move up to ``limit`` messages; committed before they are returned."""
        validate_delivery_guarantee(delivery_guarantee)
        target = _elsewhere(source_queue, target_queue)
        span = Options(
            limit=_positive(limit), after=after_timestamp, before=before_timestamp, order=order
        )
        rows = self._take(source_queue, target, with_claimed=not require_unclaimed, **span)
        return _shape(rows, with_timestamps)

    def move_generator(
        self,
        source_queue: str,
        target_queue: str,
        *,
        with_timestamps: bool = True,
        delivery_guarantee: str = "exactly_once",
        batch_size: int | None = None,
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        exact_timestamp: int | str | None = None,
        config: Any = None,
    ) -> Iterator[Row | str]:
        """Yield moved messages; ``at_least_once`` commits whole batches."""
        at_least_once = validate_delivery_guarantee(delivery_guarantee) == "at_least_once"
        target = _elsewhere(source_queue, target_queue)
        span = Options(after=after_timestamp, before=before_timestamp, exact=exact_timestamp)
        yield from self._takes(
            source_queue, target, at_least_once, with_timestamps, batch_size, config, span
        )
