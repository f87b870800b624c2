"""SimpleBroker's private validators that this backend reuses verbatim.

SimpleBroker documents that first-party backends import these private
helpers under the exact ``backend_api_version`` handshake, so input is
rejected with the same exception types and messages as on SQLite. Every such
import lives here, in one place, to make a core upgrade easy to audit.
"""

from __future__ import annotations

from simplebroker._aliases import resolve_queue_operand
from simplebroker._constants import PEEK_BATCH_SIZE, VACUUM_CLAIMED_ABSOLUTE_LIMIT
from simplebroker._message_id import normalize_message_id
from simplebroker._message_insert import normalize_insert_records
from simplebroker._message_search import (
    BODY_SEARCH_DEFAULT_LIMIT,
    BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE,
    validate_body_contains,
    validate_body_search_limit,
)
from simplebroker._selection import validate_selection_order
from simplebroker._timestamp import validate_timestamp_bound
from simplebroker.db import _ALIAS_SHADOW_WARNING_SUPPRESSED, _AliasShadowsQueueWarning


class _AliasShadowWarning:
    """The core's alias-shadows-queue warning and its CLI suppression switch."""

    category = _AliasShadowsQueueWarning

    @staticmethod
    def suppressed() -> bool:
        """Return whether the caller (the CLI) suppressed the warning."""
        return bool(_ALIAS_SHADOW_WARNING_SUPPRESSED.get())


alias_shadow_warning = _AliasShadowWarning()

__all__ = [
    "BODY_SEARCH_DEFAULT_LIMIT",
    "BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE",
    "PEEK_BATCH_SIZE",
    "VACUUM_CLAIMED_ABSOLUTE_LIMIT",
    "alias_shadow_warning",
    "normalize_insert_records",
    "normalize_message_id",
    "resolve_queue_operand",
    "validate_body_contains",
    "validate_body_search_limit",
    "validate_selection_order",
    "validate_timestamp_bound",
]
