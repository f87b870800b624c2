"""Celery on simplebroker-redis: a kombu transport with leases, and a result backend.

Importing this package registers the kombu transport alias ``simplebroker``::

    import celery_simplebroker  # noqa: F401 - registers the "simplebroker" transport

    app.conf.broker_url = "simplebroker+redis://127.0.0.1:6379/0"
    app.conf.result_backend = "simplebroker+redis://127.0.0.1:6379/0"

Each Celery queue is a SimpleBroker queue in the namespace (``broker peek
celery`` shows it). Workers hold messages under renewable leases instead of
a visibility timeout; a dead worker's messages come back within the lease.
See ``docs/celery.md``.
"""

from kombu.transport import TRANSPORT_ALIASES

from simplebroker_redis.server import URL_ENV

from .errors import AuthenticationFailed, ConnectTimedOut, ServerUnreachable, UnconfirmedPublish
from .options import FAILOVER_SCHEMES, ConfigurationError, TransportOptions, storage_queue
from .publishing import PublishOutcomeUnknown

#: The kombu transport alias this package registers on import.
TRANSPORT_ALIAS = "simplebroker"

# "simplebroker" serves a first URL (kombu splits "simplebroker+redis://..." at
# its "+"); failover alternates are resolved by their whole scheme.
for _alias in (TRANSPORT_ALIAS, *(f"{TRANSPORT_ALIAS}+{s}" for s in FAILOVER_SCHEMES)):
    TRANSPORT_ALIASES.setdefault(_alias, "celery_simplebroker.transport:Transport")

# Registers the check of every app's simplebroker URLs when the app is finalized,
# connects the task_prerun/task_postrun handlers that count runs per task name, and
# the check of a task's lease in each pool process right before it starts.
from . import prestart, taskstats, urls  # noqa: E402,F401,I001 - imported for those side effects

__all__ = [
    "TRANSPORT_ALIAS",
    "AuthenticationFailed",
    "ConnectTimedOut",
    "ServerUnreachable",
    "URL_ENV",
    "ConfigurationError",
    "PublishOutcomeUnknown",
    "TransportOptions",
    "UnconfirmedPublish",
    "storage_queue",
]
