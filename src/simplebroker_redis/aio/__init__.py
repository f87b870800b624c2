"""The backend on ``redis.asyncio``, for async integrations (Taskiq).

- :class:`AsyncRedisRunner` (:mod:`.runner`): runs the same typed calls as
  :class:`~simplebroker_redis.RedisRunner`, one pool per event loop;
- :class:`AsyncMessages` (:mod:`.writes`): writes, batched per event loop;
- :class:`AsyncLeases` (:mod:`.leases`): the reservation API;
- :class:`AsyncActivity` (:mod:`.activity`): Pub/Sub wake-ups read on the loop.

Neither side re-implements a state transition: both run the scripts of
:mod:`simplebroker_redis.calls`. Connections open lazily, per process and
event loop, so an object made at import time is safe in forked workers.
"""

from .activity import AsyncActivity
from .leases import AsyncLeases
from .runner import AsyncRedisRunner
from .writes import AsyncMessages

__all__ = ["AsyncActivity", "AsyncLeases", "AsyncMessages", "AsyncRedisRunner"]
