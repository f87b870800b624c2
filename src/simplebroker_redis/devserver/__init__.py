"""Throwaway local Valkey/Redis servers for tests, benchmarks and the demo.

``DevServer`` runs one server (``_server``). Run
``python -m simplebroker_redis.devserver --help`` for its command line.
"""

from simplebroker_redis.devserver._server import (
    SERVER_ENV,
    DevServer,
    free_port,
    main,
    server_binary,
)

__all__ = ["SERVER_ENV", "DevServer", "free_port", "main", "server_binary"]
