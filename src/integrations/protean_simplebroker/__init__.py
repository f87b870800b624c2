"""A Protean broker provider on SimpleBroker queues, on Redis or a SQLite file.

Select it in ``domain.toml``::

    [brokers.default]
    provider = "simplebroker"
    URI = "redis://127.0.0.1:6379/0"     # or a SQLite file path

The provider registers itself with Protean through the ``protean.brokers``
entry point (name ``simplebroker``); see ``docs/protean.md``.
"""

from importlib.metadata import PackageNotFoundError, version

from .broker import SimpleBrokerBroker, register
from .errors import UnconfirmedPublish

try:
    __version__ = version("simplebroker-redis")
except PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["SimpleBrokerBroker", "UnconfirmedPublish", "__version__", "register"]
