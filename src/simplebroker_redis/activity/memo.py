"""The empty-queue memo: a queue found empty stays empty until its channel hears.

Every script that makes messages of a queue pending, delayed or
reserved-then-released publishes on the queue's wake channel. So while a
listener is subscribed to that channel, a *mark* that changes with every
message read on it (and with every connect and disconnect) tells whether
the queue may have changed: a probe that found the queue empty while the
mark stayed the same need not run again. The listener keeps one
:class:`QuietMemo` and asks it under its own lock.
"""

from __future__ import annotations

#: What identifies a moment of a channel's subscription: (connection epoch,
#: messages read on the channel).
Mark = tuple[int, int]


class QuietMemo:
    """Marks per channel, and the mark at which a probe found a queue empty.

    Not locked itself: the listener calls it under its lock.
    """

    __slots__ = ("_epoch", "_heard", "_quiet")

    def __init__(self) -> None:
        self._epoch = 0  # one per connect and disconnect
        self._heard: dict[str, int] = {}  # messages read, per channel
        self._quiet: dict[tuple[str, int | None], Mark] = {}

    def new_epoch(self) -> None:
        """Invalidate every mark: the connection was opened or closed."""
        self._epoch += 1

    def heard(self, channel: str) -> None:
        """Count a wake-up read on ``channel``."""
        self._heard[channel] = self._heard.get(channel, 0) + 1

    def mark(self, channel: str) -> Mark:
        """Return ``channel``'s current mark (valid only while it is subscribed)."""
        return (self._epoch, self._heard.get(channel, 0))

    def quiet_since(self, channel: str, after: int | None) -> Mark | None:
        """Return the mark taken before a probe found the queue empty, if any."""
        return self._quiet.get((channel, after))

    def remember(self, channel: str, after: int | None, mark: Mark | None) -> None:
        """Record that a probe begun at ``mark`` found the queue empty (None: forget)."""
        if mark is None:
            self._quiet.pop((channel, after), None)
        else:
            self._quiet[(channel, after)] = mark
