"""Taskiq broker, result backend and schedule source on simplebroker-redis.

A task kicked through :class:`SimpleBrokerTaskiqBroker` is a SimpleBroker
message in the backend's namespace (``broker peek <queue>`` shows it).
Workers reserve tasks with renewable leases, renew them from a heartbeat
thread, recover a dead worker's tasks, honour the ``delay`` label natively
and dead-letter tasks that were delivered too often or rejected. See
``docs/taskiq.md``.
"""

from importlib.metadata import version as _version

from simplebroker_redis.server import URL_ENV

from .broker import SimpleBrokerTaskiqBroker
from .codec import decode_body, encode_body
from .errors import (
    ConfigurationError,
    DeadLetteredError,
    EvictionPolicyError,
    LabelError,
    MessageTooLargeError,
    ResultIsMissingError,
    ScheduleError,
    SimpleBrokerTaskiqError,
    TaskOutcomeUnknown,
)
from .result_backend import SimpleBrokerResultBackend
from .routing import DEFAULT_QUEUE
from .schedule_source import SimpleBrokerScheduleSource

#: Version of the distribution (``simplebroker-redis``) this package ships in.
__version__ = _version("simplebroker-redis")

__all__ = [
    "DEFAULT_QUEUE",
    "URL_ENV",
    "ConfigurationError",
    "DeadLetteredError",
    "EvictionPolicyError",
    "LabelError",
    "MessageTooLargeError",
    "ResultIsMissingError",
    "ScheduleError",
    "SimpleBrokerResultBackend",
    "SimpleBrokerScheduleSource",
    "SimpleBrokerTaskiqBroker",
    "SimpleBrokerTaskiqError",
    "TaskOutcomeUnknown",
    "decode_body",
    "encode_body",
]
