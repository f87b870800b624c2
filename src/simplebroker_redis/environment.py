"""SimpleBroker's own config, read from the environment as its ``broker`` command reads it.

``resolve_config()`` without ``env`` ignores the environment: a runner given
no config would then never see ``BROKER_BACKEND_PASSWORD``,
``BROKER_BUSY_TIMEOUT`` or ``BROKER_MAX_MESSAGE_SIZE``, and a limit would hold
for the ``broker`` command but not for a worker. Every place that needs
SimpleBroker's config and was given none reads it here: the connections,
the message size check, and (through :mod:`.server`, with the server it
goes with) the tools and the integrations.
"""

from __future__ import annotations

import os

from simplebroker import Config, resolve_config


def environment_config() -> Config:
    """Return SimpleBroker's config from the environment (``BROKER_*``), as its CLI reads it.

    Raises:
        InvalidConfigError: A ``BROKER_*`` variable holds an invalid value
            (SimpleBroker's error, naming it).

    """
    return resolve_config(env=os.environ)
