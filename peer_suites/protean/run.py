"""Run Protean's own broker tests on this project's provider, Redis and SQLite.

``make peer-tests-protean`` (or ``python peer_suites/protean/run.py [--protean SOURCE]``):

1. takes Protean's ``tests/`` from SOURCE: a Protean sdist (``.tar.gz``),
   an unpacked source tree, or a git directory (``fetch
   github:proteanhq/protean``; ``--rev``, default ``v<installed version>``);
   without it, the sdist of the installed Protean version (``pip download
   --no-binary :all: --no-deps protean==<version>``, kept in ``.peer/``),
   whose tests match the installed code;
2. appends ``peer_suites/protean/shim.py`` to the extracted ``tests/conftest.py``
   (the ``broker_config`` fixture gains this provider and points
   Protean's ``redis`` provider at the runner's server);
3. starts one server of its own (the bundled Valkey, or
   ``$SIMPLEBROKER_REDIS_SERVER``) and runs each suite of :data:`SUITES` on
   this provider over Redis and over a SQLite file, and on the Protean
   provider it is compared with;
4. prints every test's outcome side by side and the counts, and exits 1
   when a test that passed on Protean's provider did not pass on ours,
   unless :data:`DIFFERENCES` gives the reason (docs/protean.md lists them).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from simplebroker_redis.devserver import DevServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = REPO / ".peer"

#: Protean's capability markers up to ORDERED_MESSAGING, the level this provider
#: claims: the selection ``protean test -c BROKER`` makes for a broker of that level.
CAPABILITY_MARKERS = "basic_pubsub or simple_queuing or reliable_messaging or ordered_messaging"


@dataclass(frozen=True)
class Suite:
    """A selection of Protean's tests and the Protean provider it is compared with."""

    name: str
    targets: tuple[str, ...]  #: paths or node ids under the extraction
    reference: str  #: ``--broker`` key of the Protean provider compared with
    markers: str = ""
    extra: tuple[str, ...] = ()


SUITES: tuple[Suite, ...] = (
    # Protean runs every broker's suite as `pytest -m "<markers up to its level>"
    # tests`; the files below are every file of its tests that carries one of
    # those markers (found again at run time: see _marked_files).
    Suite("capability suite", (), "REDIS", CAPABILITY_MARKERS),
    # The generic BLOCKING_READ tests carry no marker: they branch on the
    # capability themselves.
    Suite("blocking reads", ("tests/adapters/broker/generic/test_read_blocking.py",), "REDIS"),
    # The DLQ management tests of Protean's two DLQ-capable providers. The
    # inline file takes the configured broker; the Redis file builds its own,
    # which the shim swaps for ours (its tests that poke Redis keys directly,
    # TestRedisDLQErrors and the _is_stream_id unit tests, are not selected).
    Suite(
        "DLQ (inline's tests)", ("tests/adapters/broker/inline/test_dlq_management.py",), "INLINE"
    ),
    Suite(
        "DLQ (redis's tests)",
        ("tests/adapters/broker/redis/test_redis_dlq_management.py::TestRedisDLQManagement",),
        "REDIS",
        extra=(
            "--redis",
            "--deselect",
            "tests/adapters/broker/redis/test_redis_dlq_management.py::TestRedisDLQManagement"
            "::test_dlq_list_raises_for_a_key_that_is_not_a_stream",
        ),
    ),
)

#: Ours, on each backend.
OURS: tuple[str, ...] = ("SIMPLEBROKER_REDIS", "SIMPLEBROKER_SQLITE")

#: Tests that pass on the Protean provider compared with and deliberately not on
#: ours, with the reason (docs/protean.md repeats them).
DIFFERENCES: dict[str, str] = {
    "test_dlq_management.py::test_dlq_inspect_found": (
        "asserts failed_at is not None: a message the broker dead-letters (past "
        "MAX_DELIVERIES) is moved to its group's dead-letter queue as it is, in the same "
        "step (one script on Redis), so no failure time is stored with it; ours reports "
        "failed_at None (Protean's own dead letters, published by a subscription, carry one)"
    ),
}


def protean_tests(source: str | None, rev: str | None, into: Path) -> Path:
    """Put Protean's ``tests/``, ``docs_src/`` and ``pyproject.toml`` under ``into``."""
    version = importlib.metadata.version("protean")
    wanted = ("tests", "docs_src", "pyproject.toml")
    into.mkdir(parents=True, exist_ok=True)
    path = Path(source) if source else _sdist(version)
    if path.is_dir() and (path / "tests" / "conftest.py").exists():
        for name in wanted:
            copy = shutil.copytree if (path / name).is_dir() else shutil.copy
            copy(path / name, into / name)
    elif path.is_dir():  # a git directory
        archive = subprocess.run(
            ["git", f"--git-dir={path}", "archive", rev or f"v{version}", *wanted],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    else:
        with tarfile.open(path) as sdist:
            root = sdist.getnames()[0].split("/", 1)[0]
            members = [
                m
                for m in sdist.getmembers()
                if m.name.split("/")[1:2] and m.name.split("/")[1] in wanted
            ]
            sdist.extractall(into, members=members, filter="data")
        for name in wanted:
            shutil.move(into / root / name, into / name)
        shutil.rmtree(into / root)
    with (into / "tests" / "conftest.py").open("a", encoding="utf-8") as conftest:
        conftest.write("\n\n# ---- appended by simplebroker-redis peer_suites/protean/run.py ---\n")
        conftest.write((HERE / "shim.py").read_text(encoding="utf-8"))
    return into


def _sdist(version: str) -> Path:
    target = CACHE / f"protean-{version}.tar.gz"
    if not target.exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "-q"),
                *("--no-binary", ":all:", "--no-deps", f"protean=={version}", "-d", str(CACHE)),
            ],
            check=True,
        )
    return target


def _marked_files(tree: Path) -> tuple[str, ...]:
    """Return the test files of ``tree`` that carry a capability marker."""
    marks = [f"mark.{name}" for name in CAPABILITY_MARKERS.split(" or ")]
    found = []
    for path in sorted((tree / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(mark in text for mark in marks):
            found.append(str(path.relative_to(tree)))
    return tuple(found)


def run(
    suite: Suite, key: str, tree: Path, env: dict[str, str], extra: list[str]
) -> dict[str, str]:
    """Run ``suite`` with ``--broker=key``; return test id -> outcome."""
    report = tree / f"{uuid.uuid4().hex}.xml"
    targets = suite.targets or _marked_files(tree)
    command = [
        *(sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider"),
        *("-o", "addopts=", "-o", "timeout=120", f"--broker={key}", f"--junitxml={report}"),
        *(("-m", suite.markers) if suite.markers else ()),
        *suite.extra,
        *extra,
    ]
    print(f"\n== {suite.name} on {key} ==", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=False)
    return outcomes(report) if report.exists() else {}


def outcomes(report: Path) -> dict[str, str]:
    """Return ``file::test`` -> passed/failed/skipped from a JUnit XML report."""
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = next((p for p in reversed(parts) if p.startswith("test_")), parts[-1])
        test = f"{module}.py::{case.get('name', '')}"
        if parts[-1] != module:
            test = f"{module}.py::{parts[-1]}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            found[test] = "failed"
        elif case.find("skipped") is not None:
            found[test] = "skipped"
        else:
            found[test] = "passed"
    return found


def _counts(results: dict[str, str]) -> str:
    kinds = list(results.values())
    return ", ".join(f"{kinds.count(k)} {k}" for k in ("passed", "failed", "skipped"))


def compare(suite: Suite, results: dict[str, dict[str, str]]) -> tuple[int, list[str]]:
    """Print one suite's table; return (status, summary lines)."""
    keys = [suite.reference, *OURS]
    tests = sorted({test for outcome in results.values() for test in outcome})
    width = max((len(test) for test in tests), default=10)
    print(f"\n{suite.name}\n{'test':<{width}}  " + "  ".join(f"{k:<19}" for k in keys))
    for test in tests:
        print(f"{test:<{width}}  " + "  ".join(f"{results[k].get(test, '-'):<19}" for k in keys))
    status, lines = 0, []
    for key in keys:
        lines.append(f"{suite.name}: {key}: {_counts(results[key])} (of {len(results[key])})")
    for key in OURS:
        for test, outcome in results[suite.reference].items():
            if outcome != "passed" or results[key].get(test) == "passed":
                continue
            reason = DIFFERENCES.get(test)
            if reason is None:
                lines.append(
                    f"REGRESSION on {key}: {test} passes on {suite.reference}, not on ours"
                )
                status = 1
            else:
                lines.append(f"deliberate difference on {key}: {test}: {reason}")
    return status, lines


def main(argv: list[str] | None = None) -> int:
    """Run every suite on each provider and compare."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--protean", help="Protean sdist, source tree, or git directory")
    parser.add_argument("--rev", help="git revision when --protean is a git directory")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    status, summary = 0, []
    with tempfile.TemporaryDirectory(prefix="protean-peer-") as temp:
        tree = protean_tests(args.protean, args.rev, Path(temp) / "protean")
        with DevServer(data_dir=str(Path(temp) / "server")) as server:
            base = server.url.rsplit("/", 1)[0]
            env = {
                **os.environ,
                # Ours on db 1: Protean's redis provider flushes db 2 (its suites)
                # and db 0 (its DLQ tests).
                "PEER_REDIS_URL": f"{base}/1",
                "PEER_NAMESPACE": f"protean-peer-{uuid.uuid4().hex[:8]}",
                "PEER_SQLITE_FILE": str(Path(temp) / "sqlite" / "broker.db"),
                "PEER_PROTEAN_REDIS_URL": f"{base}/2",
                "PEER_PROTEAN_REDIS_BASE": base,
                "PYTHONPATH": str(tree),
            }
            (Path(temp) / "sqlite").mkdir()
            for suite in SUITES:
                results = {
                    key: run(suite, key, tree, env, args.pytest_args)
                    for key in (suite.reference, *OURS)
                }
                code, lines = compare(suite, results)
                status, summary = max(status, code), summary + lines
    print("\n" + "\n".join(summary))
    return status


if __name__ == "__main__":
    sys.exit(main())
