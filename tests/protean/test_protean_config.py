"""The broker table: every target form, clear refusals, no password anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from protean.domain import Domain
from protean.exceptions import ConfigurationError
from protean.port.broker import registry

from protean_simplebroker import SimpleBrokerBroker
from protean_simplebroker.config import parse
from protean_simplebroker.names import Layout, decode, encode


@pytest.mark.parametrize(
    "uri",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://cache.example:6380/0?ssl_ca_certs=/etc/ca.pem",
        "unix:///run/redis/redis.sock?db=2",
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/0",
        "valkey://127.0.0.1:6379/1",
    ],
)
def test_every_redis_target_form_is_a_redis_backend(uri):
    settings = parse({"URI": uri, "NAMESPACE": "app"})
    assert (settings.backend, settings.target, settings.namespace) == ("redis", uri, "app")


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("/var/lib/app/broker.db", "/var/lib/app/broker.db"),
        ("sqlite:////var/lib/app/broker.db", "/var/lib/app/broker.db"),
        ("sqlite:///broker.db", str(Path("broker.db").absolute())),
        ("broker.db", str(Path("broker.db").absolute())),
    ],
)
def test_a_path_or_sqlite_url_is_the_sqlite_backend(uri, path):
    settings = parse({"uri": uri})  # keys are case-insensitive
    assert (settings.backend, settings.target) == ("sqlite", path)


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({}, "URI is required"),
        ({"URI": "http://h:1/0"}, "URI is not a target"),
        ({"URI": "redis+sentinel://h:1"}, "sentinel service"),
        ({"URI": ":memory:"}, "SQLite file"),
        ({"URI": "sqlite://x.db"}, "sqlite:///"),
        ({"URI": "/x.db", "NAMESPACE": "a"}, "only a Redis URI"),
        ({"URI": "redis://h:1/0", "LEASE_SECONDS": "10"}, "LEASE_SECONDS"),
        ({"URI": "redis://h:1/0", "HEARTBEAT_SECONDS": 20}, "at most half of LEASE_SECONDS"),
        ({"URI": "redis://h:1/0", "MAX_DELIVERIES": -1}, "MAX_DELIVERIES"),
        ({"URI": "redis://h:1/0", "QUEUE_PREFIX": "a--b"}, "QUEUE_PREFIX"),
        ({"URI": "redis://h:1/0", "MAX_CONNECTIONS": 0}, "max_connections"),
        ({"URI": "redis://h:1/0", "LEASE": 1}, "unknown key(s) LEASE"),
    ],
)
def test_bad_tables_are_refused_with_the_key_named(table, names):
    with pytest.raises(ConfigurationError, match=names.replace("(", r"\(").replace(")", r"\)")):
        parse(table)


def test_the_password_never_shows(caplog):
    uri = "redis://user:s3cret-pw@127.0.0.1:1/0"
    broker = SimpleBrokerBroker("default", Domain(name="pw"), {"URI": uri, "NAMESPACE": "pw"})
    assert "s3cret-pw" not in repr(broker) + repr(broker.settings)
    assert broker.ping() is False  # nothing listens on port 1
    assert broker.health_stats()["details"]["target"] == "redis://user:***@127.0.0.1:1/0"
    with pytest.raises(ConfigurationError) as refused:
        parse({"URI": "redis+sentinel://user:s3cret-pw@h:1"})
    assert "s3cret-pw" not in str(refused.value) + caplog.text
    broker.close()


def test_protean_finds_the_provider_by_its_entry_point(tmp_path):
    assert registry.get("simplebroker") is SimpleBrokerBroker
    domain = Domain(name="entry")
    domain.config["brokers"]["default"] = {
        "provider": "simplebroker",
        "URI": str(tmp_path / "b.db"),
    }
    domain.init(traverse=False)
    assert isinstance(domain.brokers["default"], SimpleBrokerBroker)
    domain.brokers.close()


@pytest.mark.parametrize("name", ["orders", "shop::order", "a-b:c", "x.y_z", "ünï cödé", "--"])
def test_names_round_trip_and_never_hold_the_separator(name):
    component = encode(name)
    assert decode(component) == name
    assert "--" not in component
    layout = Layout("protean")
    parsed = layout.parse(layout.dead(name, name))
    assert (parsed.kind, parsed.stream, parsed.group) == ("dead", name, name)
