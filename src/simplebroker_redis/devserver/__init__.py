"""Throwaway local Valkey/Redis servers and topologies for tests, benchmarks and the demo.

``DevServer`` runs one server (``_server``); ``DevCluster`` a Redis Cluster
(``_cluster``); ``DevSentinelGroup`` a primary, its replicas and sentinels
(``_sentinel``). Given ``TlsFiles``, both topologies also serve, replicate
and gossip over TLS (the server binary must be built with TLS). Every
topology lives under one temp dir, waits by polling the servers' own view
of it (never a fixed sleep), and kills its processes and removes its dir on
``stop()``, also when ``start()`` fails. Run
``python -m simplebroker_redis.devserver --help`` for the one-server CLI.
"""

from simplebroker_redis.devserver._cluster import CLUSTER_SLOTS, DevCluster, DevClusterNode
from simplebroker_redis.devserver._node import (
    TOPOLOGY_TIMEOUT,
    DevNode,
    TlsFiles,
    wait_for,
)
from simplebroker_redis.devserver._sentinel import DevSentinel, DevSentinelGroup
from simplebroker_redis.devserver._server import (
    SERVER_ENV,
    DevServer,
    PortInUse,
    free_port,
    free_ports,
    main,
    port_in_use,
    server_binary,
)

__all__ = [
    "CLUSTER_SLOTS",
    "SERVER_ENV",
    "TOPOLOGY_TIMEOUT",
    "DevCluster",
    "DevClusterNode",
    "DevNode",
    "DevSentinel",
    "DevSentinelGroup",
    "DevServer",
    "PortInUse",
    "TlsFiles",
    "free_port",
    "free_ports",
    "main",
    "port_in_use",
    "server_binary",
    "wait_for",
]
