"""SimpleBroker's ``BrokerConnection`` implemented on Valkey/Redis.

The operations are split by concern into mixins; every state change they
make is one Lua script (see ``docs/architecture.md``).
"""

from ._aliases import AliasesMixin
from ._messages import MessagesMixin
from ._queues import QueuesMixin
from ._retrieval import RetrievalMixin


class RedisBrokerCore(AliasesMixin, QueuesMixin, RetrievalMixin, MessagesMixin):
    """A broker connection bound to one :class:`~simplebroker_redis.RedisRunner`.

    Thread-safe: commands go through the runner's connection pool. Cores
    made by ``create_core`` borrow a process-wide runner; ``shutdown()`` only
    closes a runner the core owns.
    """


__all__ = ["RedisBrokerCore"]
