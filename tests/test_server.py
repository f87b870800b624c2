"""Which server and which config: one rule for the tools and every integration.

``simplebroker_redis.server.choose_server`` decides it; the tools (``--target``),
Taskiq, Celery (``simplebroker://``) and Dramatiq each ask it, and only the
words of their errors differ (what to pass). No server is needed: nothing
here connects.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simplebroker.ext import InvalidConfigError

from simplebroker_redis.server import URL_ENV, TargetError, choose_server, environment_config

PROJECT_URL = "redis://127.0.0.1:7101/2"
ENV_URL = "redis://127.0.0.1:7102/0"
NAMED_URL = "redis://127.0.0.1:7103/0"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory below a .broker.toml naming PROJECT_URL, with no server in the environment."""
    root = tmp_path / "project"
    below = root / "app" / "src"
    below.mkdir(parents=True)
    (root / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{PROJECT_URL}"\n\n'
        '[backend_options]\nnamespace = "proj"\nmax_connections = 7\n'
    )
    for name in (URL_ENV, "BROKER_BACKEND", "BROKER_BACKEND_TARGET"):
        monkeypatch.delenv(name, raising=False)
    return below


def test_the_named_target_then_the_environment_then_the_project(project, monkeypatch):
    found = choose_server(directory=project)
    assert (found.target, found.source) == (PROJECT_URL, str(project.parents[1] / ".broker.toml"))
    assert (found.options["namespace"], found.options["max_connections"]) == ("proj", 7)
    # The caller's options win over the project's, its namespace over both.
    mine = choose_server(directory=project, options={"max_connections": 3}, namespace="mine")
    assert (mine.options["namespace"], mine.options["max_connections"]) == ("mine", 3)

    monkeypatch.setenv(URL_ENV, ENV_URL)
    found = choose_server(directory=project)
    assert (found.target, found.source, found.options) == (ENV_URL, f"${URL_ENV}", {})

    found = choose_server(NAMED_URL, source="--target", directory=project)
    assert (found.target, found.source) == (NAMED_URL, "--target")


def test_a_named_target_never_reads_the_project_file(tmp_path, monkeypatch):
    (tmp_path / ".broker.toml").write_text("this is [not toml\n")
    monkeypatch.delenv(URL_ENV, raising=False)
    assert choose_server(NAMED_URL, directory=tmp_path).target == NAMED_URL
    with pytest.raises(TargetError, match="cannot read the SimpleBroker project config"):
        choose_server(directory=tmp_path)


def test_no_server_says_what_to_pass_and_where_it_looked(project, monkeypatch):
    empty = project.parents[2] / "elsewhere"  # beside the project, not below it
    empty.mkdir()
    with pytest.raises(TargetError) as raised:
        choose_server(directory=empty, asked="url=... or runner=...")
    message = str(raised.value)
    assert message.startswith("no server named: pass url=... or runner=..., ")
    assert f"${URL_ENV}" in message and ".broker.toml" in message and str(empty) in message


def test_a_project_of_another_backend_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    (tmp_path / ".broker.toml").write_text('version = 1\nbackend = "sqlite"\ntarget = "q.db"\n')
    with pytest.raises(TargetError, match=r"selects SimpleBroker backend 'sqlite'; .*\"redis\""):
        choose_server(directory=tmp_path)


def test_a_malformed_target_is_named_by_where_it_came_from(project, monkeypatch):
    with pytest.raises(TargetError, match=r"^--target: .*'redis:' must be followed by '//'"):
        choose_server("redis:/127.0.0.1:6379/0", source="--target", directory=project)
    monkeypatch.setenv(URL_ENV, "redis://127.0.0.1:/0")
    with pytest.raises(TargetError, match=rf"^\${URL_ENV}: .*the port must be a number"):
        choose_server(directory=project)


def test_a_bad_backend_option_is_simplebrokers_error_naming_it(project):
    with pytest.raises(InvalidConfigError, match="backend_options.max_connections"):
        choose_server(NAMED_URL, options={"max_connections": 0}, directory=project)


def test_simplebrokers_config_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("BROKER_MAX_MESSAGE_SIZE", "1234")
    assert environment_config()["MAX_MESSAGE_SIZE"] == 1234


def test_celerys_url_without_a_server_follows_the_same_rule(project, monkeypatch):
    """``simplebroker://`` means $SIMPLEBROKER_REDIS_URL, else the project, as elsewhere."""
    from celery_simplebroker import ConfigurationError
    from celery_simplebroker.options import resolve_target

    monkeypatch.chdir(project)
    found = resolve_target("simplebroker://")
    assert (found.target, found.options["namespace"]) == (PROJECT_URL, "proj")
    monkeypatch.setenv(URL_ENV, ENV_URL)
    assert resolve_target("simplebroker://").target == ENV_URL
    assert resolve_target(NAMED_URL).target == NAMED_URL
    monkeypatch.delenv(URL_ENV)
    monkeypatch.chdir(project.parents[2])
    with pytest.raises(ConfigurationError, match="no server named: pass a server in the broker"):
        resolve_target("simplebroker://")
