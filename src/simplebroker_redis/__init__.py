"""Valkey/Redis storage backend for SimpleBroker (backend name ``redis``).

Install the package and select it in ``.broker.toml``::

    backend = "redis"
    target = "redis://127.0.0.1:6379/0"

Public names re-exported here; see ``docs/architecture.md`` for the design.
"""

from .core import RedisBrokerCore
from .errors import ReservationConflict, ReservationLost
from .keys import DEFAULT_NAMESPACE, Keyspace
from .leases import Lease, LeasedMessage, Leases, Recovery, Settlement
from .options import BackendOptions
from .plugin import RedisBackendPlugin, redis_backend_plugin
from .runner import RedisRunner

__version__ = "0.1.0"


def get_backend_plugin() -> RedisBackendPlugin:
    """Return the ``redis`` backend plugin instance."""
    return redis_backend_plugin


__all__ = [
    "DEFAULT_NAMESPACE",
    "BackendOptions",
    "Keyspace",
    "Lease",
    "LeasedMessage",
    "Leases",
    "Recovery",
    "RedisBackendPlugin",
    "RedisBrokerCore",
    "RedisRunner",
    "ReservationConflict",
    "ReservationLost",
    "Settlement",
    "get_backend_plugin",
    "redis_backend_plugin",
]
