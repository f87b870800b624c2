"""The package's modules form layers: no module imports from a higher layer.

Layers, lowest first (docs/architecture.md draws the same picture):

0. foundation: constants and keys, errors, options, validation, IDs, the
   Lua loader, typed script calls, backoff rules (and the dev server);
1. connection construction;
2. the runners;
3. what runs on a runner: namespace lifecycle, leases, activity, async writes;
4. the SimpleBroker core;
5. the plugin and the packages' public facades.

A module may import from its own layer or lower ones, never from a higher
one, and the imports form no cycle. Every module must be placed in a layer,
so a new module cannot slip in unnoticed. Function-level imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import simplebroker_redis

PACKAGE = "simplebroker_redis"
ROOT = Path(simplebroker_redis.__file__).parent

LAYERS: dict[str, int] = {
    # 0: foundation
    "_sbcompat": 0,
    "keys": 0,
    "options": 0,
    "targets": 0,
    "target_query": 0,
    "validation": 0,
    "priorities": 0,
    "ids": 0,
    "scripts": 0,
    "errors": 0,
    "retry": 0,
    "calls": 0,
    "opcalls": 0,
    "devserver": 0,
    "devserver._server": 0,
    "devserver._node": 0,
    "devserver._cluster": 0,
    "devserver._sentinel": 0,
    "devserver.__main__": 0,
    # 1: connection construction
    "connection": 1,
    # 2: runners
    "runner": 2,
    "aio.runner": 2,
    "aio.tasks": 0,
    # 3: namespace lifecycle, leases, activity, async writes
    "namespace": 3,
    "leases": 3,
    "activity": 3,
    "aio.leases": 3,
    "aio.activity": 3,
    "aio.writes": 3,
    "heartbeat": 3,
    "observe": 3,
    "workers": 3,
    # 4: the SimpleBroker core
    "core": 4,
    "core._base": 4,
    "core._messages": 4,
    "core._retrieval": 4,
    "core._batches": 4,
    "core._queues": 4,
    "core._aliases": 4,
    # 5: plugin and public facades
    "plugin": 5,
    "metrics": 5,
    "dashboard": 5,
    "dashboard.app": 5,
    "dashboard.live": 5,
    "dashboard.__main__": 5,
    "aio": 5,
    "": 5,  # the package's __init__
}


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
    for facade in ("", "aio", "core"):
        graph[facade] = set()
    assert cycles(graph) == []


@pytest.mark.parametrize(
    ("importer", "source", "is_package"),
    [
        ("runner", "from .plugin import redis_backend_plugin\n", False),
        ("runner", "def f():\n    from . import plugin\n", False),
        ("core._base", "from ..plugin import redis_backend_plugin\n", False),
        ("keys", "import simplebroker_redis.runner\n", False),
        ("aio.runner", "from ..leases import Leases\n", False),
    ],
)
def test_the_check_finds_an_upward_import(importer, source, is_package):
    graph = {importer: imported_modules(importer, source, is_package=is_package)}
    assert upward_imports(graph), graph


def test_the_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
