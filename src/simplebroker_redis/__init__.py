"""Valkey/Redis storage backend for SimpleBroker (backend name ``redis``).

Install the package and select it in ``.broker.toml``::

    backend = "redis"
    target = "redis://127.0.0.1:6379/0"

Public names re-exported here, each asyncio twin (``Async*``) beside its
sync one; see ``docs/architecture.md`` for the design.
"""

from importlib.metadata import PackageNotFoundError, version

from .core import RedisBrokerCore
from .core.aio_messages import AsyncMessages
from .errors import (
    AccessDenied,
    OutcomeUnknown,
    Rejected,
    ReplicationTimeout,
    ReservationConflict,
    ReservationLost,
)
from .keys import DEFAULT_NAMESPACE, Keyspace
from .leases import AsyncLeases, Leases
from .options import BackendOptions
from .plugin import RedisBackendPlugin, redis_backend_plugin
from .runner import AsyncRedisRunner, RedisRunner
from .targets import InvalidTarget
from .types import Lease, LeasedMessage, Recovery, Settlement

try:
    __version__ = version("simplebroker-redis")
except PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"


def get_backend_plugin() -> RedisBackendPlugin:
    """Return the ``redis`` backend plugin instance."""
    return redis_backend_plugin


__all__ = [
    "DEFAULT_NAMESPACE",
    "AccessDenied",
    "AsyncLeases",
    "AsyncMessages",
    "AsyncRedisRunner",
    "BackendOptions",
    "InvalidTarget",
    "Keyspace",
    "Lease",
    "LeasedMessage",
    "Leases",
    "OutcomeUnknown",
    "Recovery",
    "RedisBackendPlugin",
    "RedisBrokerCore",
    "RedisRunner",
    "Rejected",
    "ReplicationTimeout",
    "ReservationConflict",
    "ReservationLost",
    "Settlement",
    "get_backend_plugin",
    "redis_backend_plugin",
]
