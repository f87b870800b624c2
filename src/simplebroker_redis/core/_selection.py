"""Which messages a claim, move, peek or reservation may take, checked once."""

from __future__ import annotations

from typing import TypedDict, Unpack

from .._sbcompat import normalize_message_id, validate_selection_order, validate_timestamp_bound


class Options(TypedDict, total=False):
    """The selection as an operation's caller gives it (SimpleBroker's input forms)."""

    limit: int
    order: str
    after: int | None
    before: int | None
    exact: object


class Selection(TypedDict):
    """A checked selection: the keyword arguments ``calls.claim`` and ``calls.peek`` take."""

    limit: int
    order: str
    after: int | None
    before: int | None
    exact: int | None


def select(**options: Unpack[Options]) -> Selection:
    """Check ``options`` with SimpleBroker's own validators (its exceptions and messages).

    Checked in a fixed order (exact ID, lower bound, upper bound, order), so
    the first bad option is the one reported. Unset options mean one
    message, oldest first, no bounds.
    """
    exact = options.get("exact")
    exact_id = None if exact is None else normalize_message_id(exact, name="exact_timestamp")
    after = validate_timestamp_bound("after_timestamp", options.get("after"))
    before = validate_timestamp_bound("before_timestamp", options.get("before"))
    order = validate_selection_order(options.get("order", "oldest"))
    limit = options.get("limit", 1)
    return Selection(limit=limit, order=order, after=after, before=before, exact=exact_id)
