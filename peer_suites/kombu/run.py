"""Run kombu's own integration tests on ``redis://`` and on ``simplebroker+redis://``.

``make peer-tests-kombu`` (or ``python peer_suites/kombu/run.py [--kombu SOURCE]``):

1. takes kombu's ``t/`` from SOURCE: a kombu sdist (``.tar.gz``), an
   unpacked source tree, or a git directory (``--rev``, default the tag of
   the installed kombu); without it, the sdist of the installed kombu
   version (``pip download --no-binary :all: --no-deps kombu==<version>``,
   kept in ``.peer/``);
2. starts one server of its own (the bundled Valkey, or
   ``$SIMPLEBROKER_REDIS_SERVER``);
3. runs ``peer_suites/kombu/bound/`` (kombu's test classes bound to a transport)
   once with kombu's Redis transport and once with ours, on that server;
4. prints the outcome of every test side by side, and exits 1 when a test
   that passed on ``redis://`` did not pass on ours, unless
   :data:`DIFFERENCES` lists it (each a documented, deliberate difference,
   see docs/celery.md, "kombu's integration tests").
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
import xml.etree.ElementTree as ET
from pathlib import Path

from simplebroker_redis.devserver import DevServer, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = REPO / ".peer"

#: Tests that pass on kombu's Redis transport and deliberately not on ours,
#: with the reason (docs/celery.md repeats them).
DIFFERENCES: dict[str, str] = {
    "test_Failover::test_failover_switches_to_alternate_url": (
        "asserts conn.port == the dead URL's port before connecting: kombu keeps a "
        "'transport+URL' (simplebroker+redis://...) whole in conn.hostname, port None, "
        "until a failover re-parses it; the failover itself works (the other "
        "assertions of the test, and test_failover_to_alias_alternate_is_allowed)"
    ),
}

PYTEST_INI = """\
[pytest]
python_classes = test_* Test*
python_files = test_*.py
markers =
    env(name): kombu's marker of the broker a test needs
    flaky(reruns, reruns_delay): kombu's reruns (not rerun here: first attempts count)
"""


def kombu_tests(source: str | None, rev: str | None, into: Path) -> Path:
    """Put kombu's ``t/`` package under ``into``; return ``into``."""
    version = importlib.metadata.version("kombu")
    if source is None:
        source = str(_sdist(version))
    path = Path(source)
    if path.is_dir() and (path / "t" / "integration" / "common.py").exists():
        shutil.copytree(path / "t", into / "t")
    elif path.is_dir():  # a git directory (``fetch github:celery/kombu``)
        tag = rev or f"v{version}"
        archive = subprocess.run(
            ["git", f"--git-dir={path}", "archive", tag, "t"], capture_output=True, check=False
        )
        if archive.returncode:
            raise SystemExit(
                f"{path}: no kombu tests at {tag!r} ({archive.stderr.decode().strip()}); "
                f"pass --rev, or use kombu {version}'s sdist (the default)"
            )
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    else:
        with tarfile.open(path) as sdist:
            members = [m for m in sdist.getmembers() if "/t/" in f"/{m.name}"]
            root = members[0].name.split("/", 1)[0]
            sdist.extractall(into, members=members, filter="data")
        shutil.move(into / root / "t", into / "t")
        shutil.rmtree(into / root)
    return into


def _sdist(version: str) -> Path:
    target = CACHE / f"kombu-{version}.tar.gz"
    if not target.exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "-q"),
                *("--no-binary", ":all:", "--no-deps", f"kombu=={version}", "-d", str(CACHE)),
            ],
            check=True,
        )
    return target


def run_side(transport: str, tree: Path, port: int, extra: list[str]) -> dict[str, str]:
    """Run the bound tests with ``transport``; return test id -> outcome."""
    report = tree / f"{transport}.xml"
    env = {
        **os.environ,
        "PEER_TRANSPORT": transport,
        "PEER_PORT": str(port),
        "PEER_DEAD_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "bound")]),
    }
    command = [
        *(sys.executable, "-m", "pytest", "bound", "-q", "-p", "no:cacheprovider"),
        *("-c", "pytest.ini", "--rootdir", str(tree), f"--junitxml={report}"),
        *("-o", "timeout=60", *extra),
    ]
    print(f"\n== kombu's integration tests on {transport} ==", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=False)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """Return test id -> passed/failed/skipped from a JUnit XML report."""
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname = case.get("classname", "").split(".")
        name = case.get("name", "")
        test = f"{classname[-1]}::{name}" if len(classname) > 2 else name  # bound.<module>.<class>
        if case.find("failure") is not None or case.find("error") is not None:
            found[test] = "failed"
        elif case.find("skipped") is not None:
            found[test] = "skipped"
        else:
            found[test] = "passed"
    return found


def compare(stock: dict[str, str], ours: dict[str, str]) -> int:
    """Print the side-by-side table and the verdict; return the exit status."""
    width = max(len(test) for test in {*stock, *ours})
    print(f"\n{'test':<{width}}  redis://  simplebroker+redis://")
    for test in sorted({*stock, *ours}):
        print(f"{test:<{width}}  {stock.get(test, '-'):<8}  {ours.get(test, '-')}")
    for side, results in (("redis://", stock), ("simplebroker+redis://", ours)):
        kinds = list(results.values())
        counts = ", ".join(f"{kinds.count(k)} {k}" for k in ("passed", "failed", "skipped"))
        print(f"{side}: {counts}")
    regressions = [
        test
        for test, outcome in stock.items()
        if outcome == "passed" and ours.get(test) != "passed"
    ]
    status = 0
    for test in regressions:
        reason = DIFFERENCES.get(test)
        if reason is None:
            print(f"REGRESSION {test}: passes on redis://, not on ours")
            status = 1
        else:
            print(f"deliberate difference {test}: {reason}")
    return status


def main(argv: list[str] | None = None) -> int:
    """Run both sides and compare them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kombu", help="kombu sdist, source tree, or git directory")
    parser.add_argument("--rev", help="git revision when --kombu is a git directory")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kombu-peer-") as temp:
        tree = kombu_tests(args.kombu, args.rev, Path(temp))
        shutil.copytree(HERE / "bound", tree / "bound")
        (tree / "pytest.ini").write_text(PYTEST_INI)
        with DevServer(data_dir=str(Path(temp) / "server")) as server:
            stock = run_side("redis", tree, server.port, args.pytest_args)
            ours = run_side("simplebroker", tree, server.port, args.pytest_args)
    return compare(stock, ours)


if __name__ == "__main__":
    sys.exit(main())
