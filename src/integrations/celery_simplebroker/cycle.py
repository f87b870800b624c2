"""The order in which a transport drains its channels: remote control before tasks.

kombu's virtual transports drain their channels in turn (``FairCycle``):
each ``drain_events`` asks the channel after the previous one. When a
worker finds a remote-control message (its pidbox queue, consumed without
acknowledgement) and a task waiting at once, which comes first then
depends on where that rotation stands, which every earlier delivery moved.
Celery's Redis transport handles them as they arrive (Pub/Sub pushes the
broadcast, which was sent first). So a ``revoke`` or
``revoke_by_stamped_headers`` sent just before the task it revokes was
sometimes handled after it: the task ran. :class:`ControlFirstCycle` asks
the channels that consume without acknowledgement first, then goes on in
turn as kombu does; a queue known empty costs no round trip
(:mod:`.wakeups`), so the extra question is free while no command waits.
"""

from __future__ import annotations

from typing import Any

from kombu.utils.scheduling import FairCycle


class ControlFirstCycle(FairCycle):
    """kombu's ``FairCycle`` over channels, channels consuming without acknowledgement first."""

    def get(self, callback: Any, **kwargs: Any) -> Any:
        """Deliver one message: from a no-ack channel if one has any, else in turn."""
        for channel in list(self.resources):
            if channel.consumes_without_ack():
                try:
                    return self.fun(channel, callback, **kwargs)
                except self.predicate:
                    pass
        return super().get(callback, **kwargs)
