"""Runners: run typed calls on a pooled connection; one retry-and-translate rule.

The sync :class:`RedisRunner` and the asyncio
:class:`AsyncRedisRunner` share
:class:`RunnerBase` and the one rule for failures:

- every redis-py error is translated into a SimpleBroker exception here
  (:func:`~simplebroker_redis.errors.translate`);
- commands are never retried blindly: a lost reply may hide a committed
  write. Only calls marked ``idempotent`` (reads) are retried, once, after a
  connection error;
- a namespace found uninitialized (cleaned up by another process) is
  initialized again and the call retried once: scripts validate before they
  write, so the retry cannot double-apply;
- on a Cluster or Sentinel target, replies that say the command was refused
  *before* it ran (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY from a demoted
  primary, LOADING, BUSY, a connection that could not be opened, no primary
  known) are followed or retried with backoff for up to ``pool_timeout``
  seconds; MOVED and ASK go to the node they name;
- with ``wait_replicas``/``wait_aof``, every state-changing script is
  pipelined with ``WAIT``/``WAITAOF`` on the same connection (one round
  trip); too few acknowledgements raise :class:`~.errors.ReplicationTimeout`.

One module per concern: :mod:`.base` (``RunnerBase``), :mod:`.sync`
(``RedisRunner``), :mod:`.aio` (its asyncio twin, ``AsyncRedisRunner``),
:mod:`.registry` (the process-wide runners cores borrow), :mod:`.attempt`
(the failure rule), :mod:`.durability` (WAIT/WAITAOF) and :mod:`.wire` (a
script sent past redis-py's command wrapper); the last three serve both
runners. This module only re-exports.
"""

from .aio import AsyncRedisRunner
from .attempt import Attempt
from .base import RunnerBase
from .registry import release_shared_runners, shared_runner
from .sync import RedisRunner
from .wire import direct, keep_limit

__all__ = [
    "AsyncRedisRunner",
    "Attempt",
    "RedisRunner",
    "RunnerBase",
    "direct",
    "keep_limit",
    "release_shared_runners",
    "shared_runner",
]
