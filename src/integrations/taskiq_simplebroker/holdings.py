"""The reservations one worker process holds, shared with its heartbeat thread.

A reservation (token) covers the messages of one ``reserve`` call. The
process holds a token while any of its messages is neither acknowledged nor
handed back; the heartbeat renews exactly those tokens. The event loop adds
and settles, the heartbeat thread takes snapshots and drops lost tokens, so
every access goes through one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Holdings:
    """Thread-safe map of held tokens to how many of their messages are unsettled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def hold(self, token: str, count: int) -> None:
        """Start holding ``count`` messages of a new reservation."""
        with self._lock:
            self._open[token] = self._open.get(token, 0) + count

    def settle(self, token: str, count: int = 1) -> bool:
        """Stop holding ``count`` messages of ``token``; False if it was not held."""
        with self._lock:
            left = self._open.get(token)
            if left is None:
                return False
            if left <= count:
                del self._open[token]
            else:
                self._open[token] = left - count
            return True

    def drop(self, tokens: Iterable[str]) -> set[str]:
        """Stop holding ``tokens`` entirely; return those that were held."""
        with self._lock:
            return {token for token in tokens if self._open.pop(token, None) is not None}

    def busy(self) -> bool:
        """Return whether any held message is still unsettled."""
        return bool(self._open)

    def tokens(self) -> list[str]:
        """Return a snapshot of the held tokens."""
        with self._lock:
            return list(self._open)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
