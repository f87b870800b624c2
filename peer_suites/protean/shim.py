"""Appended to Protean's ``tests/conftest.py`` in the temporary extraction.

Protean's suites take their broker from the session fixture
``broker_config``, keyed by ``--broker``; this redefinition (the later
definition in the module wins) adds this project's provider on both
backends and points Protean's own ``redis`` provider at the server the
runner started. ``run.py`` sets the ``PEER_*`` variables.

Protean's ``tests/adapters/broker/redis/test_redis_dlq_management.py``
builds its broker with a module function ``_broker(test_domain)``; for the
providers of this project, :func:`_peer_dlq_broker` replaces it with one
that builds ours, so that file's DLQ tests (public API only) run on it.
"""

import os as _peer_os
from collections.abc import Iterator as _PeerIterator
from typing import Any as _PeerAny

import pytest as _peer_pytest


def _peer_broker_config(key: str) -> dict[str, _PeerAny]:
    env = _peer_os.environ
    configs = {
        "SIMPLEBROKER_REDIS": {
            "provider": "simplebroker",
            "URI": env.get("PEER_REDIS_URL", ""),
            "NAMESPACE": env.get("PEER_NAMESPACE", "protean-peer"),
        },
        "SIMPLEBROKER_SQLITE": {"provider": "simplebroker", "URI": env.get("PEER_SQLITE_FILE", "")},
        "REDIS": {"provider": "redis", "URI": env.get("PEER_PROTEAN_REDIS_URL", "")},
        "INLINE": {"provider": "inline"},
    }
    return dict(configs[key])


@_peer_pytest.fixture(scope="session")
def broker_config(request: _PeerAny) -> dict[str, _PeerAny]:
    """Return the broker of ``--broker`` (this project's provider, or Protean's own)."""
    return _peer_broker_config(request.config.getoption("--broker"))


@_peer_pytest.fixture(autouse=True)
def _peer_dlq_broker(request: _PeerAny, monkeypatch: _PeerAny) -> _PeerIterator[None]:
    """Make the Redis DLQ management tests build the broker under test."""
    module = getattr(request, "module", None)
    if module is None or not module.__name__.endswith("test_redis_dlq_management"):
        yield
        return
    key = request.config.getoption("--broker")
    if key.startswith("SIMPLEBROKER"):
        from protean_simplebroker import SimpleBrokerBroker

        def build(test_domain: _PeerAny) -> _PeerAny:
            broker = SimpleBrokerBroker("test_redis", test_domain, _peer_broker_config(key))
            broker._data_reset()
            request.addfinalizer(broker.close)
            return broker

        monkeypatch.setattr(module, "_broker", build)
    else:
        base = _peer_os.environ.get("PEER_PROTEAN_REDIS_BASE", "")
        monkeypatch.setattr(module, "REDIS_URI", base)
    yield
