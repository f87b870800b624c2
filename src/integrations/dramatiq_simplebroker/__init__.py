"""Dramatiq on SimpleBroker queues in Valkey/Redis: a broker and a result backend.

``SimpleBrokerDramatiqBroker`` (:mod:`.broker`) replaces Dramatiq's
``RedisBroker``; ``SimpleBrokerResultBackend`` (:mod:`.results`) its
``RedisBackend``. See ``docs/dramatiq.md``.
"""

from .broker import SimpleBrokerDramatiqBroker
from .config import ConfigurationError
from .consumer import HeldMessage
from .results import SimpleBrokerResultBackend

__all__ = [
    "ConfigurationError",
    "HeldMessage",
    "SimpleBrokerDramatiqBroker",
    "SimpleBrokerResultBackend",
]
