"""Issue 42's fault scenarios, measured: real Taskiq / Protean workers behind a fault proxy.

Not a test (it asserts nothing and takes minutes): it reruns the scenarios
of issue 42 on the current tree and prints what happened, for the record
(docs/reliability.md and reports). 300 tasks of 0.2 s with results, one
worker (two for ``stop``), the brokers' default lease (10 s) unless said:

- ``blackhole``: 20 s without a byte either way between the workers and
  the server, then heal;
- ``reset``: every connection reset, new ones refused for 10 s, then heal;
- ``stop``: one of two workers SIGSTOPped 15 s (3x a 5 s lease), SIGCONT;
- ``producer`` (Taskiq, Protean): a producer whose replies are cut off
  (one-way blackhole): how long ``kiq()``/``publish`` takes to fail, what
  it raises, and how many copies a resend stores.

Usage: ``python benchmarks/fault_scenarios.py taskiq|protean
blackhole|reset|stop|producer [--runs N]``. Prints one line per run: tasks
done, lost, ran twice (and by the same process), stored results not of
the task's last run, seconds from the heal to the next finished task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "taskiq"), str(TESTS / "protean")]

from simplebroker_redis.devserver import DevServer  # noqa: E402
from support.eventlog import read_events  # noqa: E402
from support.faultproxy import FaultProxy  # noqa: E402
from support.namespaces import fresh_namespace  # noqa: E402

TASKS = 300
TASK_SECONDS = 0.2


def _wait(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


class Run:
    """One scenario run: a server, a proxy, a namespace, worker processes, their event log."""

    def __init__(self, framework: str, server: DevServer, folder: Path) -> None:
        self.framework = framework
        self.server = server
        self.folder = folder
        self.log = folder / "events.log"
        self.log.touch()
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self, url: str, namespace: str, name: str, lease: float | None) -> Any:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [
                    str(TESTS / "taskiq"),
                    str(TESTS),
                    str(TESTS / "protean"),
                    str(ROOT / "src"),
                    str(ROOT / "src" / "integrations"),
                ]
            ),
        }
        out = (self.folder / f"{name}.out").open("ab")
        if self.framework == "taskiq":
            env.update(
                SIMPLEBROKER_REDIS_URL=url,
                TQ_NAMESPACE=namespace,
                TQ_LOG=str(self.log),
                TQ_NAME=name,
                TQ_PREFETCH="20",
            )
            if lease is None:
                env["TQ_LEASE"] = "default"
            else:
                env.update(TQ_LEASE=str(lease), TQ_HEARTBEAT=str(lease / 4))
            args = [
                sys.executable,
                "-m",
                "taskiq",
                "worker",
                "workerapp:broker",
                "--workers",
                "1",
                "--max-async-tasks",
                "4",
            ]
        else:
            env.update(PBK_URI=url, PBK_NAMESPACE=namespace, PBK_LOG=str(self.log))
            if lease is not None:
                env.update(PBK_LEASE=str(lease), PBK_HEARTBEAT=str(lease / 4))
            args = [sys.executable, str(TESTS / "protean" / "pworker.py"), "engine"]
        process = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.workers.append(process)
        return process

    def output(self, name: str) -> str:
        return (self.folder / f"{name}.out").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    # -- what the workers logged ------------------------------------------------
    def starts(self) -> list[tuple[str, int, float]]:
        if self.framework == "taskiq":
            return [(e.words[0], e.pid, e.at) for e in read_events(self.log, "start")]
        return [(e["id"], e["pid"], 0.0) for e in self._protean() if e["what"] == "start"]

    def dones(self) -> list[tuple[str, int, float]]:
        if self.framework == "taskiq":
            return [(e.words[0], e.pid, e.at) for e in read_events(self.log, "done")]
        return [(e["id"], e["pid"], e["at"]) for e in self._protean() if e["what"] == "done"]

    def _protean(self) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [line for line in lines if line["h"] == "mailer"]


# -- producing ----------------------------------------------------------------------
async def _kiq_all(url: str, namespace: str) -> dict[str, Any]:
    from taskiq.kicker import AsyncKicker

    from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

    broker = SimpleBrokerTaskiqBroker(url, namespace=namespace)
    broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))
    await broker.startup()
    tasks = {}
    for i in range(TASKS):
        key = f"k{i}"
        tasks[key] = await AsyncKicker("workerapp:whoami", broker, {}).kiq(key, TASK_SECONDS)
    return {"broker": broker, "tasks": tasks}


def _publish_all(url: str, namespace: str) -> Any:
    import papp
    from protean.domain import Domain

    from protean_simplebroker import SimpleBrokerBroker

    domain = Domain(name="fault-scenarios")
    broker = SimpleBrokerBroker("default", domain, {"URI": url, "NAMESPACE": namespace})
    papp.domain.init(traverse=False)
    with papp.domain.domain_context():
        for i in range(TASKS):
            broker.publish(papp.STREAM, papp.order_message(f"o{i}", "sleep", str(TASK_SECONDS)))
    return broker


# -- one run ---------------------------------------------------------------------------
def run_once(framework: str, fault: str, server: DevServer) -> str:
    if fault == "producer":
        return _producer(framework, server)
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_namespace(server.url) as namespace,
        FaultProxy(("127.0.0.1", server.port)) as proxy,
    ):
        run = Run(framework, server, Path(tmp))
        lease = 5.0 if fault == "stop" else None
        names = ["a", "b"] if fault == "stop" else ["a"]
        url = server.url if fault == "stop" else proxy.url()
        workers = {name: run.start_worker(url, namespace, name, lease) for name in names}
        if framework == "taskiq":
            loop = asyncio.new_event_loop()
            produced = loop.run_until_complete(_kiq_all(server.url, namespace))
        else:
            _publish_all(server.url, namespace)
        _wait(lambda: len(run.dones()) >= 40, 120, "40 tasks done")
        healed = _inject(fault, proxy, workers)
        keys = (
            {f"k{i}" for i in range(TASKS)}
            if framework == "taskiq"
            else {f"o{i}" for i in range(TASKS)}
        )
        try:
            _wait(lambda: {d[0] for d in run.dones()} >= keys, 180, "every task done")
        except TimeoutError:
            pass
        resumed = min((d[2] for d in run.dones() if d[2] > healed), default=float("nan"))
        left = _left_reserved(server, namespace)
        stale = 0
        if framework == "taskiq":
            stale = loop.run_until_complete(_stale_results(produced, run))
            loop.run_until_complete(produced["broker"].shutdown())
        run.stop_all()
        starts = Counter(s[0] for s in run.starts())
        by_pid = Counter((s[0], s[1]) for s in run.starts())
        done = {d[0] for d in run.dones()}
        twice = sum(1 for n in starts.values() if n > 1)
        if os.environ.get("FAULTS_DEBUG"):
            for key in sorted(k for k, n in starts.items() if n > 1):
                lines = [
                    line
                    for line in run.log.read_text().splitlines()
                    if f'"{key}"' in line or f" {key} " in line
                ]
                print("\n".join(lines), file=sys.stderr)
            for name in names:
                print(run.output(name)[-6000:], file=sys.stderr)
        same = sum(1 for n in by_pid.values() if n > 1)
        logs = " ".join(run.output(name) for name in names)
        notes = []
        for phrase in (
            "not started",
            "not stored",
            "refused",
            "could renew them",
            "recovered",
            "lost:",
        ):
            if phrase in logs:
                notes.append(f"{phrase!r}x{logs.count(phrase)}")
        return (
            f"{framework} {fault}: done {len(done & keys)}/{TASKS}, lost {len(keys - done)}, "
            f"ran twice {twice} (same process {same}), stale results {stale}, left reserved "
            f"{left}, first task done {resumed - healed:.1f} s after the heal; "
            f"logs: {', '.join(notes)}"
        )


def _left_reserved(server: DevServer, namespace: str) -> int:
    """Return how many messages stay reserved once the acknowledgements had 15 s to land."""
    import redis

    client = redis.Redis(port=server.port)
    key = f"sb:{{{namespace}}}:reserved"
    deadline = time.monotonic() + 15
    while client.zcard(key) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = int(client.zcard(key))
    client.close()
    return left


def _inject(fault: str, proxy: FaultProxy, workers: dict[str, Any]) -> float:
    if fault == "blackhole":
        proxy.blackhole()
        time.sleep(20)
        proxy.heal()
    elif fault == "reset":
        proxy.reset(refuse=True)
        time.sleep(10)
        proxy.heal()
    elif fault == "stop":
        os.killpg(workers["a"].pid, signal.SIGSTOP)
        time.sleep(15)
        os.killpg(workers["a"].pid, signal.SIGCONT)
    return time.time()


async def _stale_results(produced: dict[str, Any], run: Run) -> int:
    """Count stored results that are wrong or stale.

    Wrong: not of the task, or of a process that never ran it. Stale: of
    the stopped worker (``a``, in ``stop``) for a task the other one ran
    too: its lease had been taken over.
    """
    ran: dict[str, set[int]] = {}
    for key, pid, _ in run.starts():
        ran.setdefault(key, set()).add(pid)
    stopped = {e.pid for e in read_events(run.log, "start") if e.words[1:2] == ("a",)}
    stale = 0
    for key, task in produced["tasks"].items():
        try:
            result = await produced["broker"].result_backend.get_result(task.task_id)
        except Exception:  # noqa: BLE001 - counted as lost above
            continue
        value = str(result.return_value)
        pid = int(value.split()[1]) if value.startswith(key + " ") else -1
        runners = ran.get(key, set())
        if pid not in runners or (len(runners) > 1 and pid in stopped and len(stopped) < 2):
            stale += 1
    return stale


def _producer(framework: str, server: DevServer) -> str:
    with fresh_namespace(server.url) as namespace, FaultProxy(("127.0.0.1", server.port)) as proxy:
        if framework == "taskiq":
            return asyncio.run(_taskiq_producer(proxy, server, namespace))
        return _protean_producer(proxy, server, namespace)


async def _taskiq_producer(proxy: FaultProxy, server: DevServer, namespace: str) -> str:
    from taskiq.kicker import AsyncKicker

    from simplebroker_redis import RedisRunner
    from simplebroker_redis.core import RedisBrokerCore
    from taskiq_simplebroker import SimpleBrokerTaskiqBroker

    broker = SimpleBrokerTaskiqBroker(proxy.url(), namespace=namespace)
    await broker.startup()
    kicker: Any = AsyncKicker("workerapp:add", broker, {})
    await kicker.kiq(0, 0)
    proxy.blackhole("to_client")
    started = time.monotonic()
    try:
        await kicker.with_task_id("cut-off").kiq(1, 2)
        outcome = "returned"
    except Exception as exc:  # noqa: BLE001 - reported
        outcome = f"{type(exc).__name__} <- {type(exc.__cause__).__name__}: {exc.__cause__}"
    took = time.monotonic() - started
    proxy.heal()
    await kicker.with_task_id("cut-off").kiq(1, 2)
    await broker.shutdown()
    core = RedisBrokerCore(RedisRunner(server.url, namespace=namespace))
    copies = sum("cut-off" in body for body, _ in core.peek_many("taskiq", 100))
    return (
        f"taskiq producer: failed after {took:.1f} s ({outcome[:240]}); "
        f"copies after a resend: {copies}"
    )


def _protean_producer(proxy: FaultProxy, server: DevServer, namespace: str) -> str:
    import papp
    from protean.domain import Domain

    from protean_simplebroker import SimpleBrokerBroker

    domain = Domain(name="fault-scenarios")
    broker = SimpleBrokerBroker("default", domain, {"URI": proxy.url(), "NAMESPACE": namespace})
    papp.domain.init(traverse=False)
    with papp.domain.domain_context():
        broker.publish(papp.STREAM, papp.order_message("warm"))
        message = papp.order_message("cut-off")
        proxy.blackhole("to_client")
        started = time.monotonic()
        try:
            broker.publish(papp.STREAM, message)
            outcome = "returned"
        except Exception as exc:  # noqa: BLE001 - reported
            outcome = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - started
        proxy.heal()
        broker.publish(papp.STREAM, message)
    key = message["metadata"]["headers"]["id"]
    copies = sum(key in body for body, _ in broker.store.peek(broker.layout.log(papp.STREAM), 100))
    broker.close()
    return (
        f"protean producer: failed after {took:.1f} s ({outcome[:240]}); "
        f"copies after a resend: {copies}"
    )


def main() -> None:
    """Run the chosen scenario ``--runs`` times on a fresh server; print one line per run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=("taskiq", "protean"))
    parser.add_argument("fault", choices=("blackhole", "reset", "stop", "producer"))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, DevServer(data_dir=data) as server:
        for _ in range(args.runs):
            print(run_once(args.framework, args.fault, server), flush=True)


if __name__ == "__main__":
    main()
