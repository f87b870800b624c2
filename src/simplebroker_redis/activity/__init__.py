"""Activity waiters: Pub/Sub wake-ups when a queue gets pending work.

Every script that makes messages pending publishes ``1`` on the queue's wake
channel inside the same script, so a wake-up costs no extra round trip and
never announces work that did not commit. Wake-ups are hints: owners still
drain queues through ordinary operations.

Wake-ups use sharded Pub/Sub (``SPUBLISH``/``SSUBSCRIBE``, Redis and Valkey
7+) on every topology: the channels carry the namespace's hash tag, so in a
cluster they live on the node that owns the namespace's slot and a wake-up is
not broadcast to every node; a single server or a Sentinel primary serves
them the same way, so there is one code path.

By concern:

- :mod:`.outage`: what a lost or moved subscription does (backoff, re-routing,
  one warning per outage, the PING interval), shared with the asyncio
  asyncio reader (:mod:`.aio`);
- :mod:`.listener`: :class:`WakeupListener`, the one Pub/Sub connection and
  thread per process and namespace that dispatches to every waiter;
- :mod:`.aio`: :class:`AsyncActivity`, its asyncio twin: the same wake-ups
  read by a task on the event loop, for one set of queues;
- :mod:`.memo`: the empty-queue memo that lets an idle ``has_pending_messages``
  cost one PING;
- :mod:`.registry`: this process's listeners (``listener_for``,
  ``existing_listener``, ``close_idle_listeners``);
- :mod:`.waiter`: :class:`QueueActivityWaiter`, SimpleBroker's
  ``ActivityWaiter`` (``open_waiter``).
"""

from .aio import AsyncActivity
from .listener import IDLE_LINGER, SYNC_WAIT, WakeupListener
from .outage import PING_INTERVAL, STABLE_AFTER, SUBSCRIBE_WAIT, SlotMoved
from .registry import close_idle_listeners, existing_listener, listener_for
from .waiter import STOP_POLL, QueueActivityWaiter, open_waiter, wake_channels

__all__ = [
    "AsyncActivity",
    "IDLE_LINGER",
    "PING_INTERVAL",
    "STABLE_AFTER",
    "STOP_POLL",
    "SUBSCRIBE_WAIT",
    "SYNC_WAIT",
    "QueueActivityWaiter",
    "SlotMoved",
    "WakeupListener",
    "close_idle_listeners",
    "existing_listener",
    "listener_for",
    "open_waiter",
    "wake_channels",
]
