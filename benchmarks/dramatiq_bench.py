"""Dramatiq section: this project's broker and result backend against Dramatiq's Redis ones.

On one Valkey server, per repetition (entries interleaved, order rotated):

- **throughput with results**: ``dramatiq dramatiq_app --processes 2
  --threads 8`` runs N ``echo`` tasks that store their results; the
  producer sends them all while the workers run, then waits for every
  result (``get_result(block=True)``); tasks/s from the first send to the
  last result. Then a backlog: the workers stopped (SIGSTOP), N tasks
  sent, tasks/s from SIGCONT to the last result. The server's commands per
  task (of the first run) come from ``INFO commandstats``;
- **idle cost**: the server commands per second of the idle worker
  (``RedisBroker`` polls; ours sleeps on wake-ups, its heartbeat beats);
- **recovery after SIGKILL**: two workers (one process, one thread each);
  a ``hold`` task starts on the first, which is SIGKILLed with its process
  group; the time until the second starts it. ``RedisBroker`` is measured
  with its defaults (``heartbeat_timeout`` 60 s and a maintenance pass on
  0.1 % of its commands, so usually not within the cap) and tuned
  (``heartbeat_timeout`` 10 s, maintenance on every command); ours with its
  defaults (10 s lease).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import CommandStats, Progress, Server, fmt_num, median, render_table, rotated

HERE = Path(__file__).resolve().parent

#: (entry, DQB_BROKER, RedisBroker keywords) of the throughput measurement.
THROUGHPUT = (("simplebroker", "simplebroker", {}), ("RedisBroker", "redis", {}))

#: The same for the recovery measurement.
RECOVERY = (
    ("simplebroker (lease 10 s)", "simplebroker", {}),
    ("RedisBroker (defaults)", "redis", {}),
    (
        "RedisBroker (tuned)",
        "redis",
        {"heartbeat_timeout": 10_000, "maintenance_chance": 1_000_000},
    ),
)

WORKER = ["--processes", "2", "--threads", "8"]
READY = "is ready for action"


def plan_units(reps: int) -> int:
    """Return the progress units of the section."""
    return reps * (len(THROUGHPUT) + len(RECOVERY))


class Worker:
    """One ``dramatiq dramatiq_app`` process group, its output in a file."""

    def __init__(self, env: dict[str, str], args: list[str], out: Path, processes: int) -> None:
        self.out = out
        with out.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", "dramatiq_app", *args],
                cwd=HERE,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while out.read_text(errors="replace").count(READY) < processes:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{out.read_text()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the whole group (a crash)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM the group; SIGKILL it after 30 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _env(kind: str, url: str, namespace: str, log: Path, options: dict[str, Any]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "DQB_BROKER": kind,
        "DQB_URL": url,
        "DQB_NAMESPACE": namespace,
        "DQB_LOG": str(log),
        "DQB_REDIS_OPTIONS": json.dumps(options),
    }


def _producer(env: dict[str, str]) -> Any:
    """Import the app in this process with ``env``'s broker (a fresh module each time)."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("DQB_")})
    sys.modules.pop("dramatiq_app", None)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import dramatiq_app

    return dramatiq_app


def _throughput(server: Server, kind: str, count: int, temp: Path) -> dict[str, float]:
    namespace = f"dqb-{uuid.uuid4().hex[:8]}"
    env = _env(kind, server.url, namespace, temp / "unused.log", {})
    worker = Worker(env, WORKER, temp / f"{namespace}.out", 2)
    app = _producer(env)
    stats = CommandStats(server.client)
    try:
        app.echo.send(-1).get_result(block=True, timeout=60_000)  # warm: connections, scripts
        with stats.measure() as delta:
            started = time.perf_counter()
            messages = [app.echo.send(i) for i in range(count)]
            for message in messages:
                message.get_result(block=True, timeout=120_000)
            elapsed = time.perf_counter() - started
        # A backlog: the workers stopped (SIGSTOP) while N messages are sent,
        # then timed from SIGCONT to the last result.
        os.killpg(worker.process.pid, signal.SIGSTOP)
        messages = [app.echo.send(i) for i in range(count)]
        started = time.perf_counter()
        os.killpg(worker.process.pid, signal.SIGCONT)
        for message in messages:
            message.get_result(block=True, timeout=120_000)
        drained = time.perf_counter() - started
        before = server.client.info("stats")["total_commands_processed"]
        time.sleep(
            float(os.environ.get("DQB_IDLE_WINDOW", "5"))
        )  # the idle cost is a rate: measured over a fixed window
        window = float(os.environ.get("DQB_IDLE_WINDOW", "5"))
        idle = (server.client.info("stats")["total_commands_processed"] - before - 2) / window
    finally:
        worker.stop()
        app.broker.close()
    return {
        "tasks_per_s": count / elapsed,
        "drain_per_s": count / drained,
        "commands_per_task": delta.total / count,
        "scripts_per_task": delta.scripts / count,
        "idle_commands_per_s": idle,
    }


def _recovery(
    server: Server, kind: str, options: dict[str, Any], cap: float, temp: Path
) -> float | None:
    namespace = f"dqb-{uuid.uuid4().hex[:8]}"
    log = temp / f"{namespace}.log"
    env = _env(kind, server.url, namespace, log, options)
    one = ["--processes", "1", "--threads", "1"]
    victim = Worker(env, one, temp / f"{namespace}-victim.out", 1)
    app = _producer(env)
    survivor = None
    try:
        app.hold.send("k", 3600)
        deadline = time.monotonic() + 60
        while not log.exists() or not log.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError("the victim never started the task")
            time.sleep(0.01)
        survivor = Worker(env, one, temp / f"{namespace}-survivor.out", 1)
        victim.kill()
        killed = time.time()
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline:
            starts = [float(line.split()[0]) for line in log.read_text().splitlines()[1:]]
            if starts:
                return starts[0] - killed
            time.sleep(0.05)
        return None
    finally:
        victim.kill()
        if survivor is not None:
            survivor.kill()
        app.broker.close()


def run_section(
    server: Server,
    *,
    reps: int,
    quick: bool,
    progress: Progress,
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run every entry ``reps`` times, interleaved; return medians."""
    count = 500 if quick else 3000
    cap = 30.0 if quick else 180.0
    rates: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in THROUGHPUT}
    recoveries: dict[str, list[float | None]] = {name: [] for name, _, _ in RECOVERY}
    with tempfile.TemporaryDirectory(prefix="bench-dramatiq-") as temp:
        for rep in range(reps):
            for name, kind, _ in rotated(list(THROUGHPUT), rep):
                progress.step(f"dramatiq {name}")
                result = _throughput(server, kind, count, Path(temp))
                rates[name].append(result)
                emit({"kind": "sample", "section": "dramatiq", "entry": name, **result})
            for name, kind, options in rotated(list(RECOVERY), rep):
                progress.step(f"dramatiq recovery {name}")
                seconds = _recovery(server, kind, options, cap, Path(temp))
                recoveries[name].append(seconds)
                emit(
                    {"kind": "sample", "section": "dramatiq", "entry": name, "recovery_s": seconds}
                )
    keys = (
        "tasks_per_s",
        "drain_per_s",
        "commands_per_task",
        "scripts_per_task",
        "idle_commands_per_s",
    )
    return {
        "count": count,
        "cap_s": cap,
        "throughput": {
            name: {key: median(s[key] for s in rows) for key in keys}
            for name, rows in rates.items()
        },
        "recovery": {
            name: {
                "median_s": median(v for v in values if v is not None)
                if all(v is not None for v in values)
                else None,
                "samples": values,
            }
            for name, values in recoveries.items()
        },
    }


def report(summary: dict[str, Any], *, markdown: bool = False) -> str:
    """Return the section's tables."""
    rows = []
    for name, _, _ in THROUGHPUT:
        row = summary["throughput"][name]
        rows.append(
            [
                name,
                fmt_num(row["tasks_per_s"]),
                fmt_num(row["drain_per_s"]),
                fmt_num(row["commands_per_task"]),
                fmt_num(row["scripts_per_task"]),
                fmt_num(row["idle_commands_per_s"]),
            ]
        )
    headers = [
        "broker",
        "tasks/s, sent while running",
        "tasks/s, a backlog",
        "server cmds/task",
        "scripts/task",
        "idle cmds/s",
    ]
    table = render_table(headers, rows, markdown)
    recovery_rows = []
    for name, _, _ in RECOVERY:
        found = summary["recovery"][name]
        samples = ", ".join("-" if v is None else f"{v:.1f}" for v in found["samples"])
        shown = "not within the cap" if found["median_s"] is None else f"{found['median_s']:.1f} s"
        recovery_rows.append([name, shown, samples])
    recovery = render_table(["broker", "recovery (median)", "samples (s)"], recovery_rows, markdown)
    return (
        f"Dramatiq end to end ({summary['count']} tasks with results, 2 processes x 8 threads, "
        f"median)\n\n{table}\n\nRecovery after SIGKILL of a worker mid-task (cap "
        f"{summary['cap_s']:.0f} s)\n\n{recovery}"
    )
