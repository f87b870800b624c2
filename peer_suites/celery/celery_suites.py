"""Run Celery's own integration suites on Celery's Redis transport and on ours, side by side.

``make peer-tests-celery`` runs this (it is not part of ``make test``: the canvas
suite alone takes about 15 minutes a side). Steps:

1. Extract Celery's ``t/integration/`` (with ``t/__init__.py``,
   ``t/canvas_helpers.py`` and Celery's ``pyproject.toml``, which holds its
   pytest settings) into a temp dir: from ``--source`` (a Celery work tree,
   a git dir with the tag ``v<installed version>``, or an sdist tarball),
   else from the sdist of the installed Celery version, which ``pip
   download`` fetches into ``--cache``.
2. Start one throwaway server (the bundled Valkey, or
   ``$SIMPLEBROKER_REDIS_SERVER``) for every run.
3. Run each suite with Celery's conftest (``TEST_BROKER``, ``TEST_BACKEND``;
   its session worker is a real prefork ``celery`` worker in the pytest
   process) three ways, flushing the server in between:

   - ``stock``: ``redis://`` broker and result backend (Celery's own);
   - ``ours``: ``simplebroker+redis://`` broker and result backend;
   - ``gated``: the tests ``ours`` skipped because they require a result
     backend whose URL starts with ``redis``, run again with our broker and
     Celery's ``redis`` backend alias pointed at our backend (see
     ``celery_peer_plugin.py``).

   Every test has a pytest-timeout (``--timeout``), every run a wall-clock
   limit (``--run-timeout``): a run that exceeds it is killed and its
   unfinished test recorded as hung.
4. Write ``<out>/celery-summary.md``: counts per suite and side, and every
   test that passes on ``stock`` but not on ours, with its first error line.
   Each run's records and output stay in ``<out>``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import redis

from simplebroker_redis.devserver import DevServer

HERE = Path(__file__).resolve().parent
SUITES = {"canvas": "test_canvas.py", "tasks": "test_tasks.py", "inspect": "test_inspect.py"}
SIDES = ("stock", "ours", "gated")
#: The suite's skip messages for a result backend whose URL does not start with ``redis``
#: ("Requires redis result backend.", "Requires redis or rpc result backend.").
GATE_REASON = re.compile(r"Requires redis( or \w+)? result backend")
#: Outcomes that count as the suite's expectation met, and which match which.
PASSING = {"passed": "pass", "xpassed": "pass", "xfailed": "xfail"}
#: Files of a Celery source tree the suites need (the rest of ``t/`` is not imported).
WANTED = ("t/__init__.py", "t/canvas_helpers.py", "t/integration", "pyproject.toml")


def celery_version() -> str:
    """Return the installed Celery version (the suites must match it)."""
    return version("celery")


def extract(source: str | None, cache: Path, dest: Path) -> str:
    """Put Celery's integration suite under ``dest``; return where it came from."""
    wanted = celery_version()
    tag = f"v{wanted}"
    if source and Path(source, "t", "integration").is_dir():
        for name in WANTED:
            src = Path(source, name)
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target)
            else:
                shutil.copy2(src, target)
        return f"work tree {source}"
    if source and not source.endswith((".tar.gz", ".tgz")):
        found = subprocess.run(
            ["git", f"--git-dir={source}", "rev-parse", "--verify", "-q", f"{tag}^{{tree}}"],
            capture_output=True,
            text=True,
        )
        if found.returncode == 0:
            archive = subprocess.run(
                ["git", f"--git-dir={source}", "archive", tag, *WANTED],
                capture_output=True,
                check=True,
            )
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(dest, filter="data")
            return f"git {source} at {tag}"
        print(f"{source} has no tag {tag}: using Celery's {wanted} sdist", file=sys.stderr)
        source = None
    if source is None:
        cache.mkdir(parents=True, exist_ok=True)
        source = str(cache / f"celery-{wanted}.tar.gz")
        if not Path(source).exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
                + ["--no-binary", ":all:", f"celery=={wanted}", "-d", str(cache)],
                check=True,
            )
    with tarfile.open(source) as tar:
        top = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if _wanted(m.name, top)]
        for member in members:
            member.name = member.name[len(top) + 1 :]
        tar.extractall(dest, members=members, filter="data")
    return f"sdist {source}"


def _wanted(name: str, top: str) -> bool:
    inner = name[len(top) + 1 :]
    return any(inner == w or inner.startswith(w + "/") for w in WANTED)


def environment(side: str, url: str, report: Path, only: Path | None) -> dict[str, str]:
    """Return the environment of one pytest run of Celery's suite."""
    host_port = url.split("://", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    ours = f"simplebroker+{url}"
    broker, backend = {"stock": (url, url), "ours": (ours, ours), "gated": (ours, url)}[side]
    env = {
        **os.environ,
        "TEST_BROKER": broker,
        "TEST_BACKEND": backend,
        "REDIS_HOST": host,
        "REDIS_PORT": port,
        "PEER_REPORT": str(report),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    if side == "gated":
        env["PEER_ALIAS_REDIS"] = "1"
    if only is not None:
        env["PEER_ONLY"] = str(only)
    return env


def run_suite(
    tree: Path, suite: str, side: str, url: str, out: Path, args: argparse.Namespace
) -> Path | None:
    """Run one suite on one side; return its records, or None when nothing was asked for."""
    report = out / f"celery-{suite}-{side}.jsonl"
    report.unlink(missing_ok=True)
    only = None
    if side == "gated":
        skipped = gated_tests(out / f"celery-{suite}-ours.jsonl")
        if not skipped:
            return None
        only = out / f"celery-{suite}-gated.ids"
        only.write_text("\n".join(skipped) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-p", "celery.contrib.pytest"]
    command += ["-p", "celery_peer_plugin", f"t/integration/{SUITES[suite]}", "-q", "-rN"]
    command += ["--timeout", str(args.timeout), "-o", "asyncio_default_fixture_loop_scope=function"]
    command += ["-k", args.k] if args.k else []
    env = environment(side, url, report, only)
    log = out / f"celery-{suite}-{side}.log"
    started = time.monotonic()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            with open(report, "a", encoding="utf-8") as records:
                records.write(json.dumps({"killed": args.run_timeout}) + "\n")
    took = time.monotonic() - started
    with open(report, "a", encoding="utf-8") as records:
        records.write(json.dumps({"took": round(took)}) + "\n")
    print(f"{suite:8} {side:6} {took:7.0f} s  {summarize(outcomes(report))}", flush=True)
    return report


def gated_tests(report: Path) -> list[str]:
    """Return the tests a run on our URLs skipped for want of a ``redis`` result backend."""
    gated = []
    for record in _records(report):
        if record.get("outcome") == "skipped" and GATE_REASON.search(str(record.get("message"))):
            gated.append(record["nodeid"])
    return gated


def _records(report: Path) -> Iterator[dict[str, object]]:
    if report.exists():
        for line in report.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)


def outcomes(report: Path | None) -> dict[str, tuple[str, str]]:
    """Return each test's outcome (as pytest counts it) and first error line."""
    result: dict[str, tuple[str, str]] = {}
    for record in _records(report) if report is not None else ():
        if "killed" in record:
            for nodeid, (state, _) in result.items():
                if state == "running":
                    result[nodeid] = ("hung", f"run killed after {record['killed']} s")
            continue
        if "took" in record:
            continue
        nodeid = str(record["nodeid"])
        result[nodeid] = _fold(result.get(nodeid, ("running", "")), record)
    return result


def _fold(current: tuple[str, str], record: dict[str, object]) -> tuple[str, str]:
    """Return a test's outcome once ``record`` (one phase's report) is taken into account."""
    state, when, outcome = current[0], record["when"], record.get("outcome")
    if when == "start":
        return ("running", "")
    if outcome == "failed":
        if state == "failed":
            return current
        kind = "failed" if when == "call" or record.get("subtest") else "error"
        return (kind, str(record.get("message", "")))
    if state != "running":
        return current
    if outcome == "skipped" and when in ("setup", "call"):
        return ("xfailed" if record.get("xfail") else "skipped", str(record.get("message", "")))
    if outcome == "passed" and when in ("call", "teardown"):
        return ("xpassed" if record.get("xfail") else "passed", "")
    return current


def summarize(tests: dict[str, tuple[str, str]]) -> str:
    """Return pytest-style counts (``231 passed, 2 failed``)."""
    counts: dict[str, int] = {}
    for state, _ in tests.values():
        counts[state] = counts.get(state, 0) + 1
    order = ("passed", "failed", "error", "hung", "skipped", "xfailed", "xpassed", "running")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s)) or "nothing ran"


def took(report: Path) -> str:
    """Return how long the run took (`` (N s)``), or nothing when it did not end."""
    seconds = [r["took"] for r in _records(report) if "took" in r]
    return f" ({seconds[-1]} s)" if seconds else ""


def write_summary(out: Path, suites: list[str], origin: str) -> Path:
    """Write the side-by-side table and the list of differences; return its path."""
    lines = [
        f"# Celery {celery_version()} integration suites: Redis transport vs ours",
        "",
        f"Suites from {origin}.",
        "",
        "| suite | stock `redis://` | ours `simplebroker+redis://` | ours, gated tests run |",
        "|---|---|---|---|",
    ]
    differences: list[str] = []
    for suite in suites:
        stock = outcomes(out / f"celery-{suite}-stock.jsonl")
        ours = outcomes(out / f"celery-{suite}-ours.jsonl")
        gated = outcomes(out / f"celery-{suite}-gated.jsonl")
        merged = {**ours, **gated}
        row = [
            summarize(stock) + took(out / f"celery-{suite}-stock.jsonl"),
            summarize(ours) + took(out / f"celery-{suite}-ours.jsonl"),
            summarize(merged) + took(out / f"celery-{suite}-gated.jsonl"),
        ]
        lines.append(f"| {SUITES[suite]} | " + " | ".join(row) + " |")
        for nodeid, (state, _) in sorted(stock.items()):
            if state not in PASSING:
                continue
            mine, why = merged.get(nodeid, ("not run", ""))
            if PASSING.get(mine) != PASSING[state]:
                differences.append(f"- `{nodeid}`: {state} on stock, **{mine}** on ours: {why}")
    lines += ["", "## Passing on stock, not on ours", ""]
    lines += differences or ["None."]
    path = out / "celery-summary.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def server(dest: Path) -> Iterator[DevServer]:
    """One throwaway server for every run."""
    srv = DevServer(data_dir=str(dest / "server"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the suites, write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="Celery work tree, git dir or sdist (default: the sdist)")
    parser.add_argument("--suites", default="canvas,tasks,inspect", help="of: " + ",".join(SUITES))
    parser.add_argument("--sides", default="stock,ours,gated", help="of: " + ",".join(SIDES))
    parser.add_argument("--out", default=".peer", help="records, logs and the summary")
    parser.add_argument("--cache", default=".peer/cache", help="where the sdist is kept")
    parser.add_argument("-k", help="pytest -k expression (e.g. one failing test)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test")
    parser.add_argument("--run-timeout", type=int, default=3600, help="seconds per suite run")
    parser.add_argument(
        "--summary-only", action="store_true", help="rewrite the summary from --out's records"
    )
    args = parser.parse_args(argv)
    suites = [s for s in args.suites.split(",") if s]
    sides = [s for s in args.sides.split(",") if s]
    unknown = sorted(set(suites) - set(SUITES)) + sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"unknown suite or side: {', '.join(unknown)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.summary_only:
        known = out / "celery-origin.txt"
        origin = known.read_text(encoding="utf-8").strip() if known.exists() else str(out)
        print(f"summary: {write_summary(out, suites, origin)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="celery-peer-") as temp:
        tree = Path(temp) / "celery"
        origin = extract(args.source, Path(args.cache).resolve(), tree)
        (out / "celery-origin.txt").write_text(origin + "\n", encoding="utf-8")
        with server(Path(temp)) as srv:
            client = redis.Redis.from_url(srv.url)
            for suite in suites:
                for side in sides:
                    client.flushall()  # our own throwaway server
                    run_suite(tree, suite, side, srv.url, out, args)
            client.close()
    print(f"summary: {write_summary(out, suites, origin)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
