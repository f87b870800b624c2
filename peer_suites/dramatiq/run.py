"""Run Dramatiq's own tests on its ``RedisBroker`` and on ours, side by side.

``make peer-tests-dramatiq`` (or ``python peer_suites/dramatiq/run.py [--dramatiq SOURCE]``):

1. takes Dramatiq's ``tests/`` from SOURCE: a git directory (``fetch
   github:Bogdanp/dramatiq``; ``--rev``, default the tag ``v<installed
   version>``, else ``HEAD``) or an unpacked source tree. Dramatiq's sdist
   lacks ``tests/conftest.py`` and ``tests/common.py``, so a source tree or
   git directory is needed; without SOURCE, ``.peer/dramatiq`` is cloned
   from GitHub once;
2. appends ``peer_suites/dramatiq/shim.py`` to the extracted ``tests/conftest.py``:
   every broker fixture (``stub_broker``, ``redis_broker``) and result
   backend fixture becomes the broker under test on the runner's server,
   so Dramatiq's tests of actors, workers, middleware, results and
   composition run on a real broker; and copies
   ``test_redis_client_view.py`` (``tests/test_redis.py``'s tests that read
   RedisBroker's private keys, rewritten against what a client sees);
3. starts one server of its own (the bundled Valkey, or
   ``$SIMPLEBROKER_REDIS_SERVER``) and runs the tests twice on it: with
   ``RedisBroker`` and with ``SimpleBrokerDramatiqBroker``;
4. runs each test that passed on ``RedisBroker`` but not on ours
   :data:`RECHECKS` more times on both sides (a test that fails on
   ``RedisBroker`` too when run again is flaky, not a regression; so is one
   that passes every rerun on ours: both are printed);
5. prints every test's outcome side by side and the counts, and exits 1
   when a test that passed on ``RedisBroker`` did not pass on ours, unless
   the rerun or :data:`DIFFERENCES` gives the reason (docs/dramatiq.md lists them).

Not run: RabbitMQ's tests, the CLI and watcher tests (they start their own
apps with brokers of their own), the benchmarks, and the memcached
variants (no server here; the shim parametrizes rate limiters with Redis
and the stub, result backends with the side's own).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from simplebroker_redis.devserver import DevServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = REPO / ".peer"
UPSTREAM = "https://github.com/Bogdanp/dramatiq"

#: Dramatiq's test files not run (see the module docstring).
EXCLUDED = ("test_rabbitmq.py", "test_cli.py", "test_watch.py", "benchmarks")

#: Tests that pass on RedisBroker and deliberately not on ours, with the reason.
DIFFERENCES: dict[str, str] = {}

#: test_redis.py's tests replaced by test_redis_client_view.py (private keys or
#: commands of RedisBroker: do_enqueue, do_fetch, do_qsize, the .XQ zset, ...).
REWRITTEN: tuple[str, ...] = (
    "test_redis_unacked_messages_can_be_requeued",
    "test_redis_messages_can_be_dead_lettered",
    "test_redis_dead_lettered_messages_are_cleaned_up",
    "test_redis_messages_belonging_to_missing_actors_are_rejected",
    "test_redis_requeues_unhandled_messages_on_shutdown",
    "test_redis_requeues_unhandled_delay_messages_on_shutdown",
    "test_redis_broker_can_connect_via_url",
    "test_redis_broker_can_connect_via_client",
    "test_redis_consumer_ack_can_retry_on_connection_error",
    "test_redis_consumer_nack_can_retry_on_connection_error",
    "test_redis_join_race_condition",
)


def dramatiq_tests(source: str | None, rev: str | None, into: Path) -> Path:
    """Put Dramatiq's ``tests/`` under ``into``; return ``into``."""
    version = importlib.metadata.version("dramatiq")
    path = Path(source) if source else _clone()
    if (path / "tests" / "conftest.py").exists():
        shutil.copytree(path / "tests", into / "tests")
        return into
    tags = subprocess.run(
        ["git", f"--git-dir={path}", "tag", "--list", f"v{version}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    tag = rev or (tags[0] if tags else "HEAD")
    if tag == "HEAD" and rev is None:
        print(f"{path}: no tag v{version}; taking the tests at HEAD", flush=True)
    archive = subprocess.run(
        ["git", f"--git-dir={path}", "archive", tag, "tests"], capture_output=True, check=False
    )
    if archive.returncode:
        raise SystemExit(f"{path}: no Dramatiq tests at {tag!r}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _clone() -> Path:
    target = CACHE / "dramatiq.git"
    if not target.exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--bare", UPSTREAM, str(target)], check=True)
    return target


def prepare(tree: Path) -> None:
    """Bind the extracted tests to ``$PEER_BROKER`` (the shim) and add the rewritten tests."""
    tests = tree / "tests"
    conftest = tests / "conftest.py"
    conftest.write_text(conftest.read_text() + (HERE / "shim.py").read_text())
    shutil.copy(HERE / "test_redis_client_view.py", tests / "test_redis_client_view.py")
    for name in EXCLUDED:
        target = tests / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    (tree / "pylibmc.py").write_text(PYLIBMC_STAND_IN)


#: Dramatiq's conftest imports pylibmc (memcached), a C extension that needs
#: libmemcached to build; this stand-in reaches no server, so the memcached
#: tests skip on both sides exactly as they do on a machine without memcached.
PYLIBMC_STAND_IN = '''\
"""Stand-in for pylibmc: no memcached here (peer_suites/dramatiq/run.py)."""


class SomeErrors(Exception):
    pass


class Error(SomeErrors):
    pass


class NotFound(Error):
    pass


class Client:
    def __init__(self, *args, **kwargs):
        pass

    def get_stats(self):
        raise SomeErrors("no memcached server in the peer run")


class ClientPool:
    def __init__(self, client, *args, **kwargs):
        self.client = client

    def reserve(self):
        import contextlib

        return contextlib.nullcontext(self.client)
'''


def run_side(broker: str, tree: Path, url: str, extra: list[str]) -> dict[str, str]:
    """Run the tests with ``broker``; return test id -> outcome."""
    report = tree / f"{broker}.xml"
    env = {
        **os.environ,
        "PEER_BROKER": broker,
        "PEER_URL": url,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
    }
    deselect = [f"--deselect=tests/test_redis.py::{name}" for name in REWRITTEN]
    command = [
        *(sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"),
        *("--rootdir", str(tree), f"--junitxml={report}", "-o", "timeout=120", "--tb=native"),
        *("-o", "addopts=", *deselect, *extra),
    ]
    print(f"\n== Dramatiq's tests on {broker} ==", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=False)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """Return test id -> passed/failed/skipped from a JUnit XML report.

    The report is kept in ``.peer/`` (``dramatiq-<side>.xml``), with every
    failure's message.
    """
    CACHE.mkdir(exist_ok=True)
    shutil.copy(report, CACHE / f"dramatiq-{report.stem}.xml")
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        test = f"{module}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            found[test] = "failed"
        elif case.find("skipped") is not None:
            found[test] = "skipped"
        else:
            found[test] = "passed"
    return found


def failure_kinds(report: Path) -> dict[str, int]:
    """Return how many tests failed with each exception type (from a kept report)."""
    kinds: dict[str, int] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        for tag in ("failure", "error"):
            element = case.find(tag)
            if element is not None:
                message = element.get("message", "") or "?"
                kind = message.split(":", 1)[0].split("(", 1)[0].strip()[:60]
                kinds[kind] = kinds.get(kind, 0) + 1
                break
    return kinds


#: Runs of each side a test that failed on ours (and passed on RedisBroker) gets again.
RECHECKS = 3


def rerun(tree: Path, url: str, broker: str, test: str) -> int:
    """Run one test :data:`RECHECKS` times on ``broker``; return how often it passed."""
    module, name = test.split("::", 1)
    path = next(tree.glob(f"tests/**/{module}.py"))
    node = f"{path.relative_to(tree)}::{name}"
    env = {
        **os.environ,
        "PEER_BROKER": broker,
        "PEER_URL": url,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
    }
    passed = 0
    for _ in range(RECHECKS):
        command = [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider"]
        command += ["--rootdir", str(tree), "-o", "timeout=120", "--tb=no"]
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, check=False)
        passed += done.returncode == 0
    return passed


def recheck(tree: Path, url: str, stock: dict[str, str], ours: dict[str, str]) -> dict[str, str]:
    """Tell a flaky test from a regression: run each suspect again on both sides.

    A test that also fails on RedisBroker when run again is flaky there
    too; one that passes every rerun on ours failed by chance in the full
    run. Returns test -> verdict for the suspects that are not regressions.
    """
    verdicts: dict[str, str] = {}
    for test, outcome in sorted(stock.items()):
        if outcome != "passed" or ours.get(test) == "passed":
            continue
        theirs, mine = rerun(tree, url, "redis", test), rerun(tree, url, "simplebroker", test)
        if theirs < RECHECKS:
            verdicts[test] = f"flaky on RedisBroker too: reruns passed {theirs}/{RECHECKS} there"
        elif mine == RECHECKS:
            verdicts[test] = f"failed once, passed {mine}/{RECHECKS} reruns on ours"
        print(f"recheck {test}: RedisBroker {theirs}/{RECHECKS}, ours {mine}/{RECHECKS}")
    return verdicts


def compare(stock: dict[str, str], ours: dict[str, str], flaky: dict[str, str]) -> int:
    """Print the side-by-side table and the verdict; return the exit status."""
    width = max(len(test) for test in {*stock, *ours})
    print(f"\n{'test':<{width}}  RedisBroker  SimpleBrokerDramatiqBroker")
    for test in sorted({*stock, *ours}):
        print(f"{test:<{width}}  {stock.get(test, '-'):<11}  {ours.get(test, '-')}")
    for side, results in (("RedisBroker", stock), ("SimpleBrokerDramatiqBroker", ours)):
        kinds = list(results.values())
        counts = ", ".join(f"{kinds.count(k)} {k}" for k in ("passed", "failed", "skipped"))
        print(f"{side}: {counts}")
    kinds = failure_kinds(CACHE / "dramatiq-redis.xml")
    print("failures on RedisBroker by exception type (most use StubBroker's own API):")
    for kind, count in sorted(kinds.items(), key=lambda item: -item[1]):
        print(f"  {count:4d}  {kind}")
    status = 0
    for test, outcome in sorted(stock.items()):
        if outcome != "passed" or ours.get(test) == "passed":
            continue
        if test in flaky:
            print(f"not a regression {test}: {flaky[test]}")
            continue
        reason = DIFFERENCES.get(test)
        if reason is None:
            print(f"REGRESSION {test}: passes on RedisBroker, not on ours")
            status = 1
        else:
            print(f"deliberate difference {test}: {reason}")
    return status


def main(argv: list[str] | None = None) -> int:
    """Run both sides and compare them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dramatiq", help="Dramatiq git directory or source tree")
    parser.add_argument("--rev", help="git revision when --dramatiq is a git directory")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dramatiq-peer-") as temp:
        tree = dramatiq_tests(args.dramatiq, args.rev, Path(temp))
        prepare(tree)
        with DevServer(data_dir=str(Path(temp) / "server")) as server:
            stock = run_side("redis", tree, server.url, args.pytest_args)
            ours = run_side("simplebroker", tree, server.url, args.pytest_args)
            flaky = recheck(tree, server.url, stock, ours)
    return compare(stock, ours, flaky)


if __name__ == "__main__":
    sys.exit(main())
