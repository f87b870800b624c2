"""The package's modules form layers: no module imports from a higher layer.

Layers, lowest first (docs/architecture.md draws the same picture):

0. foundation: constants and keys, errors, options, validation, IDs, the
   Lua loader, typed script calls and their types, backoff rules, lease
   timing, task spans (and the dev server);
1. connection construction;
2. the runners;
3. what runs on a runner: namespace lifecycle, leases, activity, async writes,
   which server and which config;
4. the SimpleBroker core;
5. the plugin and the packages' public facades; the operations wing (``ops/``:
   exporter, dashboard, the library loader), which nothing outside it imports
   but the ``python -m`` modules that keep its documented command names.

A module may import from its own layer or lower ones, never from a higher
one, and the imports form no cycle. Every module must be placed in a layer,
so a new module cannot slip in unnoticed. Function-level imports count too.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

import pytest

import simplebroker_redis

PACKAGE = "simplebroker_redis"
ROOT = Path(simplebroker_redis.__file__).parent

LAYERS: dict[str, int] = {
    # 0: foundation
    "_sbcompat": 0,
    "keys": 0,
    "codec": 0,
    "options": 0,
    "targets": 0,
    "target_query": 0,
    "validation": 0,
    "queue_names": 0,
    "priorities": 0,
    "ids": 0,
    "scripts": 0,
    "scripts.__main__": 5,  # `python -m simplebroker_redis.scripts`: ops.functions
    "errors": 0,
    "environment": 0,
    "lease_timing": 0,
    "tracing": 0,
    "tlsprobe": 0,
    "retry": 0,
    "types": 0,
    "calls": 0,
    "calls.base": 0,
    "calls.queues": 0,
    "calls.leases": 0,
    "calls.journal": 0,
    "calls.schedules": 0,
    "calls.celery": 0,
    "calls.dramatiq": 0,
    "calls.operations": 0,
    "calls.tasks": 0,
    "taskrecord": 0,
    "devserver": 0,
    "devserver._server": 0,
    "devserver._node": 0,
    "devserver._cluster": 0,
    "devserver._sentinel": 0,
    "devserver._topology": 0,
    "devserver.__main__": 0,
    # 1: connection construction
    "connection": 1,
    # 2: runners
    "runner": 2,
    "runner.attempt": 2,
    "runner.base": 2,
    "runner.durability": 2,
    "runner.registry": 2,
    "runner.sync": 2,
    "runner.wire": 2,
    "runner.aio": 2,
    "loop_tasks": 0,  # stopping background tasks of the event loop
    # 3: namespace lifecycle, leases, activity, async writes
    "namespace": 3,
    "leases": 3,
    "leases.sync": 3,
    "leases.aio": 3,
    "holdings": 3,
    "activity": 3,
    "activity.outage": 3,
    "activity.memo": 3,
    "activity.listener": 3,
    "activity.registry": 3,
    "activity.waiter": 3,
    "activity.aio": 3,
    "heartbeat": 3,
    "server": 3,  # which server and which config: the tools' and integrations' one rule
    "workers": 3,
    "tasks": 3,  # the task index, statistics and formats
    "tasks.formats": 0,
    "tasks.stats": 3,
    # 4: the SimpleBroker core
    "core": 4,
    "core._base": 4,
    "core._messages": 4,
    "core._retrieval": 4,
    "core._batches": 4,
    "core._queues": 4,
    "core._aliases": 4,
    "core._selection": 4,
    "core.aio_messages": 3,  # AsyncMessages: asyncio writes, beside the core's own
    # 5: plugin and public facades
    "plugin": 5,
    "": 5,  # the package's __init__
    # 5: the operations wing, and the modules that keep its `python -m` names
    "ops": 5,
    "ops.observe": 5,
    "ops.cli": 5,
    "ops.task_summary": 5,
    "ops.metrics": 5,
    "ops.functions": 5,
    "ops.dashboard": 5,
    "ops.dashboard.app": 5,
    "ops.dashboard.live": 5,
    "ops.dashboard.access": 5,
    "ops.dashboard.actions": 5,
    "ops.dashboard.tasks": 5,
    "ops.dashboard.__main__": 5,
    "metrics": 5,  # `python -m simplebroker_redis.metrics`
    "dashboard": 5,  # `python -m simplebroker_redis.dashboard`
}

#: Modules outside ``ops/`` that may import it: the ``python -m`` names it keeps.
OPS_COMMANDS = frozenset({"metrics", "dashboard", "scripts.__main__"})


def module_name(path: Path) -> str:
    """Return the dotted name of a package file relative to the package ('' for __init__)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(importer: str, source: str, *, is_package: bool) -> set[str]:
    """Return the package-relative modules ``source`` imports (any nesting level)."""
    base = importer.split(".") if importer else []
    if not is_package and base:
        base = base[:-1]  # a module's relative imports start at its package
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE).lstrip("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
            elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                target = node.module.removeprefix(PACKAGE).lstrip(".")
            else:
                continue
            for alias in node.names:
                # "from . import calls" names a submodule; "from .calls import Call" does not.
                child = f"{target}.{alias.name}" if target else alias.name
                found.add(child if child in LAYERS else target)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        source = path.read_text(encoding="utf-8")
        graph[name] = imported_modules(name, source, is_package=path.name == "__init__.py")
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Return every import of a higher layer, as 'importer (L) -> imported (L)'."""
    problems = []
    for importer, targets in graph.items():
        for target in sorted(targets):
            if LAYERS[target] > LAYERS[importer]:
                problems.append(
                    f"{importer or PACKAGE} ({LAYERS[importer]}) -> {target} ({LAYERS[target]})"
                )
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for child in sorted(graph.get(node, ())):
            if state.get(child) == 1:
                found.append([*path[path.index(child) :], child])
            elif child not in state:
                visit(child, [*path, child])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_has_a_layer():
    graph = import_graph()
    assert sorted(set(graph) - set(LAYERS)) == []
    assert sorted(set(LAYERS) - set(graph)) == []


def test_no_module_imports_from_a_higher_layer():
    assert upward_imports(import_graph()) == []


def test_imports_form_no_cycle():
    graph = {name: {t for t in targets if t != name} for name, targets in import_graph().items()}
    # A package __init__ re-exporting its own submodules is the facade, not a cycle.
    for facade in ("", "core"):
        graph[facade] = set()
    assert cycles(graph) == []


@pytest.mark.parametrize(
    ("importer", "source", "is_package"),
    [
        ("runner", "from .plugin import redis_backend_plugin\n", False),
        ("runner", "def f():\n    from . import plugin\n", False),
        ("core._base", "from ..plugin import redis_backend_plugin\n", False),
        ("keys", "import simplebroker_redis.runner\n", False),
        ("runner.aio", "from ..leases import Leases\n", False),
    ],
)
def test_the_check_finds_an_upward_import(importer, source, is_package):
    graph = {importer: imported_modules(importer, source, is_package=is_package)}
    assert upward_imports(graph), graph


def test_the_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_nothing_but_its_commands_imports_the_ops_wing():
    """The tools sit above the core: no storage module, and not the plugin, depends on them."""
    outside = {
        importer: sorted(t for t in targets if t == "ops" or t.startswith("ops."))
        for importer, targets in import_graph().items()
        if importer != "ops" and not importer.startswith("ops.") and importer not in OPS_COMMANDS
    }
    assert {importer: found for importer, found in outside.items() if found} == {}


#: Each asyncio twin in a module of its own, and its sync twin beside it (same
#: package). A class ``AsyncX`` anywhere else must share its module with ``X``.
ASYNC_TWINS: dict[str, tuple[str, str]] = {
    "runner.aio": ("runner.sync", "RedisRunner"),
    "activity.aio": ("activity.listener", "WakeupListener"),
    "leases.aio": ("leases.sync", "Leases"),
    "core.aio_messages": ("core._messages", "MessagesMixin"),
}


def _classes(name: str) -> set[str]:
    path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
    if not path.exists():
        path = ROOT.joinpath(*name.split("."), "__init__.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def _package_of(name: str) -> str:
    return name.rpartition(".")[0]


def test_each_asyncio_twin_sits_beside_its_sync_twin():
    """No folder of asyncio code apart: an ``Async*`` class lives by its sync twin's concern."""
    assert not (ROOT / "aio").exists()
    apart = []
    for name in import_graph():
        classes = _classes(name)
        for cls in sorted(c for c in classes if c.startswith("Async")):
            if name in ASYNC_TWINS:
                twin, twin_class = ASYNC_TWINS[name]
                assert _package_of(twin) == _package_of(name), (name, twin)
                assert twin_class in _classes(twin), (twin, twin_class)
            elif cls.removeprefix("Async") not in classes:
                apart.append(f"{name}.{cls}")
    assert apart == []


def _operations(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def test_the_lease_objects_are_twins_of_one_liners_over_calls():
    """One way to run a call: each lease operation is one ``runner.run(calls.<builder>(...))``."""
    from simplebroker_redis import AsyncLeases, Leases, calls

    sync, asyncio_ = _operations(Leases), _operations(AsyncLeases)
    assert sync == asyncio_  # the same operations, the same arguments
    for cls in (Leases, AsyncLeases):
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in sync:
                body = node.body[1:] if ast.get_docstring(node) else node.body
                assert len(body) == 1 and isinstance(body[0], ast.Return), node.name
                run = body[0].value
                run = run.value if isinstance(run, ast.Await) else run
                assert isinstance(run, ast.Call) and ast.unparse(run.func) == "self.runner.run"
                built = run.args[0]
                assert isinstance(built, ast.Call), node.name
                builder = ast.unparse(built.func)
                assert builder.startswith("calls."), (node.name, builder)
                assert hasattr(calls, builder.removeprefix("calls.")), builder


#: Each framework's room in the core: its calls, keys and reply types (its Lua
#: is in ``lua/<room>/``, see ``scripts.ROOMS``). The core imports no room but
#: the ``calls`` facade re-exporting the builders; an integration none but its own.
ROOMS: dict[str, str] = {
    "celery_simplebroker": "calls.celery",
    "taskiq_simplebroker": "calls.schedules",
    "dramatiq_simplebroker": "calls.dramatiq",
}


def test_no_module_of_the_core_imports_a_frameworks_room():
    rooms = set(ROOMS.values())
    found = {
        importer: sorted(targets & rooms)
        for importer, targets in import_graph().items()
        if importer not in rooms and importer != "calls"
    }
    assert {importer: names for importer, names in found.items() if names} == {}


def _room_names() -> dict[str, str]:
    """Return every name a room defines (its builders, keys, types) -> the room."""
    import importlib

    owner: dict[str, str] = {}
    for room in ROOMS.values():
        module = importlib.import_module(f"{PACKAGE}.{room}")
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__:
                owner[name] = room
    return owner


def _top_level_imports(path: Path) -> set[str]:
    """Return the first component of every absolute import in ``path`` (any nesting level)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_of_the_core_imports_an_integration():
    """The backend and its tools know no framework: integrations register (entry points)."""
    importing = {
        str(path.relative_to(ROOT)): sorted(_top_level_imports(path) & set(INTEGRATION_PACKAGES))
        for path in ROOT.rglob("*.py")
    }
    assert {name: found for name, found in importing.items() if found} == {}


# -- the integrations (src/integrations/) ------------------------------------------------
#
# Each integration package is a tree of its own: its modules form layers
# as the core's do (every module placed, no import of a higher layer), they
# import one another in no cycle (TYPE_CHECKING and function-level imports
# count too), none imports another integration, and none is over MAX_LINES
# lines. What they share lives in the core (``server``, ``lease_timing``, ``tracing``,
# ``heartbeat``).
# The Celery package keeps kombu's shape: what a message is and the
# registries first, then the store, the poller, the channel, and the
# transport and result backend on top; the result backend reaches the
# transport only through the ack-with-result registry (``acks``).

INTEGRATIONS = Path(__file__).resolve().parent.parent / "src" / "integrations"
INTEGRATION_PACKAGES = (
    "celery_simplebroker",
    "dramatiq_simplebroker",
    "protean_simplebroker",
    "taskiq_simplebroker",
)

#: Longest module of an integration (docs: "modules under ~450 lines").
MAX_LINES = 450

#: Modules still over MAX_LINES, each with the work that splits it; the test
#: fails once one is under the limit, so the entry goes with the split.
OVERSIZED: dict[str, str] = {}

CELERY_LAYERS: dict[str, int] = {
    # 0: the message envelope, options, errors, staged publishes, shared bindings
    "envelope": 0,
    "options": 0,
    "errors": 0,
    "staging": 0,
    "bindings": 0,
    "tracing": 0,  # trace context in message headers (optional OpenTelemetry)
    "entries": 0,  # stored result values, their wake-up channels
    "taskformat": 0,  # how the dashboard reads stored tasks and results
    # 1: registries, wake-ups, the app's URL checks, worker metrics (Celery signals),
    # the channel order, result waiting and chords
    "cycle": 1,
    "consumer": 1,
    "chords": 1,
    "urls": 1,
    "metrics": 1,
    "taskstats": 1,  # runs counted per task name (Celery signals)
    "acks": 1,
    "wakeups": 1,
    # network faults: an outage's state, results fenced by their lease,
    # idempotent publishes, settlements deferred through an outage
    "outage": 0,
    "fencing": 1,
    "prestart": 1,  # a task's lease checked in the pool process before it starts
    "publishing": 1,
    "settlements": 1,
    # 2: what is done on the server, and its heartbeat
    "store": 2,
    # 3: when to poll
    "poller": 3,
    # 4: kombu's channel
    "channel": 4,
    # 5: kombu's transport, Celery's result backend, the package facade
    "transport": 5,
    "backend": 5,
    "": 6,
}

TASKIQ_LAYERS: dict[str, int] = {
    # 0: errors, message bodies and their size check, which reservation holds
    # each task, the optional middlewares (metrics, tracing)
    "errors": 0,
    "codec": 0,
    "sizing": 0,
    "deliveries": 0,
    "metrics": 0,
    "tracing": 0,
    "taskformat": 0,  # how the dashboard reads stored tasks and results
    "taskstats": 0,  # tasks sent and runs finished, per task name
    # 1: where a runner connects, routing, shards, the server's eviction
    # policy, the commit batcher, the dead-letter watch
    "connection": 1,
    "routing": 1,
    "shards": 1,
    "eviction": 1,
    "commit": 1,
    "sending": 1,
    "deadletters": 1,
    # 2: a worker's per-process state; 3: its listener
    "runtime": 2,
    "listener": 3,
    # 4: Taskiq's result backend and schedule source; 5: the broker (it
    # checks its result backend's server with its own); the package facade
    "result_backend": 4,
    "schedule_source": 4,
    "broker": 5,
    "": 6,
}

PROTEAN_LAYERS: dict[str, int] = {
    # 0: queue names, message envelopes, the SQLite consumers' liveness locks
    "names": 0,
    "messages": 0,
    "liveness": 0,
    "taskformat": 0,  # how the dashboard reads stored messages
    "errors": 0,  # the provider's own exceptions
    # 1: the broker table's settings, recorded failures
    "config": 1,
    "failures": 1,
    # 2: what a backend offers; 3: the two backends, consumer groups, held messages
    "store": 2,
    "redis_store": 3,
    "sqlite_store": 3,
    "groups": 3,
    "inflight": 3,
    # 4: dead letters, health reports and reads over the groups; 5: Protean's broker
    "dlq": 4,
    "reads": 4,
    "reports": 4,
    "broker": 5,
    "": 6,
}

DRAMATIQ_LAYERS: dict[str, int] = {
    # 0: settings and where to connect, tracing; 1: the storage operations, a consumer's sleep
    "config": 0,
    "tracing": 0,
    "metrics": 0,
    "store": 1,
    "wakeups": 1,
    # 1: what the dashboard reads of a message, the per actor counts
    "taskformat": 1,
    "taskstats": 1,
    # 2: the consumer and the messages it holds; 3: the result backend and the broker
    "consumer": 2,
    "results": 3,
    "broker": 3,
    "": 4,
}

#: Each integration package's layers.
INTEGRATION_LAYERS: dict[str, dict[str, int]] = {
    "celery_simplebroker": CELERY_LAYERS,
    "dramatiq_simplebroker": DRAMATIQ_LAYERS,
    "protean_simplebroker": PROTEAN_LAYERS,
    "taskiq_simplebroker": TASKIQ_LAYERS,
}


def integration_graph(package: str) -> dict[str, set[str]]:
    """Return module -> package-relative modules it imports, for one integration package."""
    root = INTEGRATIONS / package
    names = {module_name_in(root, path) for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name_in(root, path)
        base = name.split(".") if name else []
        if path.name != "__init__.py" and base:
            base = base[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {
                    alias.name.removeprefix(package).lstrip(".")
                    for alias in node.names
                    if alias.name == package or alias.name.startswith(package + ".")
                }
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
                elif node.module and (node.module + ".").startswith(package + "."):
                    target = node.module.removeprefix(package).lstrip(".")
                else:
                    continue
                for alias in node.names:
                    child = f"{target}.{alias.name}" if target else alias.name
                    found.add(child if child in names else target)
        graph[name] = found - {name}
    return graph


def module_name_in(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@pytest.mark.parametrize("package", INTEGRATION_PACKAGES)
def test_an_integration_imports_no_cycle(package):
    graph = integration_graph(package)
    graph[""] = set()  # the __init__ re-exporting its modules is the facade, not a cycle
    assert cycles(graph) == []


@pytest.mark.parametrize("package", INTEGRATION_PACKAGES)
def test_an_integration_imports_no_ops_tool(package):
    """An integration is a client of the core; the operations tools read what it stores."""
    for path in (INTEGRATIONS / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            assert not any(name.startswith(f"{PACKAGE}.ops") for name in names), path


@pytest.mark.parametrize("package", INTEGRATION_PACKAGES)
def test_an_integration_imports_no_other_integration(package):
    others = [name for name in INTEGRATION_PACKAGES if name != package]
    for path in (INTEGRATIONS / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                assert node.module.split(".")[0] not in others, path
            elif isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & set(others), path


def test_no_integration_module_is_over_the_limit():
    sizes = {
        str(path.relative_to(INTEGRATIONS)): len(path.read_text(encoding="utf-8").splitlines())
        for path in INTEGRATIONS.rglob("*.py")
    }
    assert {name for name, lines in sizes.items() if lines > MAX_LINES} == set(OVERSIZED)


@pytest.mark.parametrize("package", INTEGRATION_PACKAGES)
def test_an_integration_keeps_its_layers(package):
    layers = INTEGRATION_LAYERS[package]
    graph = integration_graph(package)
    assert sorted(set(graph) ^ set(layers)) == []  # every module has a layer
    upward = [
        f"{importer} -> {target}"
        for importer, targets in graph.items()
        for target in targets
        if layers[target] > layers[importer]
    ]
    assert upward == []


def test_every_package_in_src_has_its_layers():
    src = INTEGRATIONS.parent
    # The core's modules have LAYERS above; each integration, its own.
    assert {path.relative_to(src).parts[0] for path in src.rglob("*.py")} == {
        PACKAGE,
        INTEGRATIONS.name,
    }
    packages = {path.relative_to(INTEGRATIONS).parts[0] for path in INTEGRATIONS.rglob("*.py")}
    assert packages == set(INTEGRATION_PACKAGES) == set(INTEGRATION_LAYERS)


def test_the_result_backend_reaches_the_transport_only_through_acks():
    graph = integration_graph("celery_simplebroker")
    assert graph["backend"] & {"transport", "channel", "poller", "store"} == set()


def test_the_integration_check_finds_a_cycle_and_its_names(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from pkg import a\n")
    monkeypatch.setattr(sys.modules[__name__], "INTEGRATIONS", tmp_path)
    graph = integration_graph("pkg")
    assert graph == {"": set(), "a": {"b"}, "b": {"a"}}
    assert cycles(graph) == [["a", "b", "a"]]


def rooms_reached(source: str, owner: dict[str, str]) -> set[str]:
    """Return the rooms ``source`` imports from or calls into (``calls.<a room's name>``)."""
    rooms, reached = set(owner.values()), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = node.module.removeprefix(PACKAGE + ".")
            if module in rooms:
                reached.add(module)
            elif module == "calls":
                for alias in node.names:
                    room = f"calls.{alias.name}"
                    reached.add(room if room in rooms else owner.get(alias.name, ""))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "calls" and node.attr in owner:
                reached.add(owner[node.attr])
    return reached - {""}


@pytest.mark.parametrize("package", INTEGRATION_PACKAGES)
def test_an_integration_uses_no_other_frameworks_room(package):
    """Celery's calls, keys and types are Celery's: no other integration reaches into them."""
    owner, reached = _room_names(), set()
    for path in (INTEGRATIONS / package).rglob("*.py"):
        reached |= rooms_reached(path.read_text(encoding="utf-8"), owner)
    assert reached - {ROOMS.get(package)} == set()


def test_the_room_check_sees_a_builder_of_another_room():
    owner = _room_names()
    assert owner["celery_store"] == "calls.celery"
    assert owner["entry_key"] == "calls.celery"
    assert owner["schedule_claim"] == "calls.schedules"
    assert owner["dramatiq_store"] == "calls.dramatiq"
    source = (
        "from simplebroker_redis import calls\n"
        "from simplebroker_redis.calls import celery as c, LostRun\n"
        "calls.dramatiq_store\ncalls.reserve\n"
    )
    assert rooms_reached(source, owner) == {"calls.celery", "calls.schedules", "calls.dramatiq"}
