"""Names of the keys this integration adds to a namespace.

Every name starts with the namespace's key prefix (``sb:{<namespace>}:``), so
it shares the namespace's hash tag (one Redis Cluster slot, and SimpleBroker's
namespace cleanup removes it), followed by ``celery:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from simplebroker_redis import Keyspace

#: Separates exchange, routing key and queue in a binding's name.
BINDING_SEPARATOR: Final[str] = "\x1f"


# TODO(keys): move to keys.Keyspace
@dataclass(frozen=True, slots=True)
class CeleryKeys:
    """Key names of the Celery transport and result backend in one namespace."""

    prefix: str  #: ``sb:{<namespace>}:celery:``
    bindings: str  #: hash: "<exchange> US <routing key> US <queue>" -> JSON value
    binding_deadlines: str  #: zset: binding -> expiry (server ms), expiring queues only

    @classmethod
    def of(cls, keys: Keyspace) -> CeleryKeys:
        """Return the Celery keys of the namespace ``keys`` belongs to."""
        prefix = f"{keys.prefix}celery:"
        return cls(
            prefix=prefix,
            bindings=prefix + "bindings",
            binding_deadlines=prefix + "binding_deadlines",
        )

    def result(self, name: str) -> str:
        """Return the key storing the result backend's entry ``name`` (Celery's key name)."""
        return self.prefix + name
