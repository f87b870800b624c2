"""Claim, peek and move: one script call per bounded operation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from simplebroker.ext import validate_delivery_guarantee

from .. import calls
from .._sbcompat import (
    PEEK_BATCH_SIZE,
    normalize_message_id,
    validate_selection_order,
    validate_timestamp_bound,
)
from ..types import Row, TakeMode
from ..validation import validate_queue_name
from ._batches import BatchesMixin


def _shape(rows: list[Row], with_timestamps: bool) -> list[Row] | list[str]:
    return rows if with_timestamps else [body for body, _ in rows]


def _one(rows: list[Row], with_timestamps: bool) -> Row | str | None:
    if not rows:
        return None
    return rows[0] if with_timestamps else rows[0][0]


class RetrievalMixin(BatchesMixin):
    """Exactly-once claim and move, peeks, and the generator front ends."""

    def _take(
        self,
        queue: str,
        op: TakeMode,
        *,
        target: str = "",
        limit: int = 1,
        order: str = "oldest",
        after: int | None = None,
        before: int | None = None,
        exact: object = None,
        with_claimed: bool = False,
    ) -> list[Row]:
        validate_queue_name(queue)
        self._guard(f"{op} operation")
        if op == "move":
            validate_queue_name(target)
        exact_id = None if exact is None else normalize_message_id(exact, name="exact_timestamp")
        after = validate_timestamp_bound("after_timestamp", after)
        before = validate_timestamp_bound("before_timestamp", before)
        order = validate_selection_order(order)
        rows = self._run(
            calls.claim(
                queue,
                op,
                target=target,
                limit=limit,
                order=order,
                after=after,
                before=before,
                exact=exact_id,
                with_claimed=with_claimed,
                maintenance=self._maintenance_spec(),
            )
        )
        self._record_activity(len(rows))
        return rows

    def _look(
        self,
        queue: str,
        *,
        limit: int,
        order: str = "oldest",
        after: int | None = None,
        before: int | None = None,
        exact: object = None,
        include_claimed: bool = False,
    ) -> list[Row]:
        validate_queue_name(queue)
        exact_id = None if exact is None else normalize_message_id(exact, name="exact_timestamp")
        after = validate_timestamp_bound("after_timestamp", after)
        before = validate_timestamp_bound("before_timestamp", before)
        order = validate_selection_order(order)
        return self._run(
            calls.peek(
                queue,
                limit=limit,
                order=order,
                after=after,
                before=before,
                exact=exact_id,
                include_claimed=include_claimed,
            )
        )

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
        rows = self._take(queue, "claim", exact=exact_timestamp, order=order)
        return _one(rows, with_timestamps)

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
        if limit < 1:
            raise ValueError("limit must be at least 1")
        rows = self._take(
            queue,
            "claim",
            limit=limit,
            after=after_timestamp,
            before=before_timestamp,
            order=order,
        )
        return _shape(rows, with_timestamps)

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
        if validate_delivery_guarantee(delivery_guarantee) == "at_least_once":
            yield from self._reserved_batches(
                queue,
                target="",
                with_timestamps=with_timestamps,
                limit=self._batch_size(batch_size, config),
                after=after_timestamp,
                before=before_timestamp,
                exact=exact_timestamp,
            )
            return
        while True:
            rows = self._take(
                queue,
                "claim",
                after=after_timestamp,
                before=before_timestamp,
                exact=exact_timestamp,
            )
            if not rows:
                return
            yield rows[0] if with_timestamps else rows[0][0]

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
            queue,
            limit=1,
            exact=exact_timestamp,
            include_claimed=include_claimed,
            order=order,
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
        if limit < 1:
            raise ValueError("limit must be at least 1")
        rows = self._look(
            queue,
            limit=limit,
            after=after_timestamp,
            before=before_timestamp,
            include_claimed=include_claimed,
            order=order,
        )
        return _shape(rows, with_timestamps)

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
        cursor = after_timestamp
        while True:
            rows = self._look(
                queue,
                limit=page,
                after=cursor,
                before=before_timestamp,
                exact=exact_timestamp,
                include_claimed=include_claimed,
            )
            for row in rows:
                yield row if with_timestamps else row[0]
            if exact_timestamp is not None or len(rows) < page or not rows:
                return
            cursor = rows[-1][1]

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
        if source_queue == target_queue:
            raise ValueError("Source and target queues cannot be the same")
        rows = self._take(
            source_queue,
            "move",
            target=target_queue,
            exact=exact_timestamp,
            with_claimed=not require_unclaimed,
            order=order,
        )
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
        if source_queue == target_queue:
            raise ValueError("Source and target queues cannot be the same")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        rows = self._take(
            source_queue,
            "move",
            target=target_queue,
            limit=limit,
            after=after_timestamp,
            before=before_timestamp,
            with_claimed=not require_unclaimed,
            order=order,
        )
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
        guarantee = validate_delivery_guarantee(delivery_guarantee)
        if source_queue == target_queue:
            raise ValueError("Source and target queues cannot be the same")
        if guarantee == "at_least_once":
            validate_queue_name(target_queue)
            yield from self._reserved_batches(
                source_queue,
                target=target_queue,
                with_timestamps=with_timestamps,
                limit=self._batch_size(batch_size, config),
                after=after_timestamp,
                before=before_timestamp,
                exact=exact_timestamp,
            )
            return
        while True:
            rows = self._take(
                source_queue,
                "move",
                target=target_queue,
                after=after_timestamp,
                before=before_timestamp,
                exact=exact_timestamp,
            )
            if not rows:
                return
            yield rows[0] if with_timestamps else rows[0][0]
