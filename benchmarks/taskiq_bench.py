"""Taskiq benchmarks: one ``taskiq worker`` process, a trivial task, several brokers.

For every broker entry (see :mod:`taskiq_app`) with results off and on, and
every repetition, the entries interleaved:

1. **pre-load**: with no worker running, N tasks are kicked (250 at a time,
   concurrently); kick-side round trips are counted in this process and
   server commands from ``INFO commandstats``;
2. **drain**: a fresh ``taskiq worker --workers 1`` starts; from the moment
   its broker reports ready to the N-th saved task: rate, worker CPU per
   task, consume-side round trips (counted inside the worker) and server
   commands (the worker is the only client doing anything);
3. **end-to-end**: with the worker running, the producer kicks N tasks
   (250 in flight); rate = N / (first kick .. last task saved);
4. **kick-to-result latency** (results on): sequential ``kiq()`` +
   ``wait_result(check_interval=0.5 ms)`` calls;

then the worker is stopped. Only one worker process exists at a time, and
no process is ever paused (a SIGSTOPped asyncio worker trips redis-py's
5 s socket timeout when resumed).

Progress ("ready", "task saved") comes from a worker middleware over a
local socket (one line per task, no Redis command), with the worker's round
trips, commands and CPU time so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    HERE,
    RESULTS_DIR,
    ClientCounter,
    LineHub,
    Progress,
    Server,
    fmt_num,
    fmt_ratio,
    in_order,
    median,
    percentile,
    render_table,
    rotated,
)

#: Polling interval of ``wait_result`` in the latency test (taskiq's default is 0.2 s).
LATENCY_POLL = 0.0005

#: Kicks the producer keeps in flight (pre-load and end-to-end phases).
IN_FLIGHT = 250


# -- progress reports from the workers ---------------------------------------------------------


@dataclass
class Report:
    """A worker's counters at one moment (from one line it sent)."""

    at: float  #: when the line arrived (perf_counter)
    round_trips: int
    commands: int
    cpu_ns: int


@dataclass
class WorkerState:
    """What one worker process has reported."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    ready: Report | None = None
    last: Report | None = None
    count: int = 0
    target: int | None = None
    reached: Report | None = None

    def expect(self, target: int) -> None:
        """Arm the report taken when ``count`` reaches ``target``."""
        with self.cond:
            self.target = target
            self.reached = self.last if self.count >= target else None

    def wait_ready(self, timeout: float) -> Report:
        """Block until the worker's broker started."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.ready is not None, timeout):
                raise TimeoutError("worker did not report ready")
            assert self.ready is not None
            return self.ready

    def wait(self, timeout: float) -> Report:
        """Block until the armed target is reached; return the report that reached it."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.reached is not None, timeout):
                raise TimeoutError(f"worker reported {self.count} tasks, expected {self.target}")
            assert self.reached is not None
            return self.reached


class SignalHub(LineHub):
    """Local TCP server receiving the workers' lines (``hello <tag>`` first on each connection)."""

    def __init__(self) -> None:
        self.states: dict[str, WorkerState] = {}
        super().__init__(backlog=16)

    def state(self, tag: str) -> WorkerState:
        """Return (creating) the state of worker ``tag``."""
        return self.states.setdefault(tag, WorkerState())

    def handle(self, now: float, lines: list[list[str]], peer: dict[str, Any]) -> None:
        for kind, *rest in lines:
            if kind == "hello":
                peer["state"] = self.state(rest[0])
                continue
            state: WorkerState = peer["state"]
            report = Report(now, int(rest[0]), int(rest[1]), int(rest[2]))
            with state.cond:
                state.last = report
                if kind == "ready":
                    state.ready = report
                else:
                    state.count += 1
                    if (
                        state.target is not None
                        and state.reached is None
                        and state.count >= state.target
                    ):
                        state.reached = report
                state.cond.notify_all()


# -- worker processes ----------------------------------------------------------------------------


class Worker:
    """One ``taskiq worker --workers 1`` process group."""

    def __init__(self, combo: Combo, url: str, hub: SignalHub, log_dir: Path) -> None:
        self.tag = f"{combo.key}-{uuid.uuid4().hex[:6]}"
        self.state = hub.state(self.tag)
        self.log_path = log_dir / f"worker-{self.tag}.log"
        env = dict(os.environ)
        env.update(
            BENCH_TQ_ENTRY=combo.entry,
            BENCH_TQ_URL=url,
            BENCH_TQ_KEY=combo.key,
            BENCH_TQ_RESULTS="1" if combo.results else "0",
            BENCH_TQ_SIGNAL=str(hub.port),
            BENCH_TQ_TAG=self.tag,
            PYTHONPATH=os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p),
        )
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskiq",
                "worker",
                "taskiq_app:broker",
                "--workers",
                "1",
                "--log-level",
                "WARNING",
                "--shutdown-timeout",
                "2",
            ],
            cwd=str(HERE),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def ready(self, timeout: float = 60.0) -> Report:
        """Wait until the worker's broker has started."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.state.wait_ready, timeout)
        except TimeoutError:
            raise RuntimeError(f"worker {self.tag} did not start; see {self.log_path}") from None

    def stop(self) -> None:
        """Kill the worker process group.

        Every measured task is saved and acknowledged by now; taskiq's graceful
        shutdown takes 5-10 s after a busy run (waiting on blocked reads).
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()
        if self.log_path.stat().st_size == 0:
            self.log_path.unlink()


# -- the measurements ------------------------------------------------------------------------------


@dataclass
class Combo:
    """A broker entry with results on or off, and its producer."""

    entry: str
    label: str
    results: bool
    key: str = ""
    producer: Any = None
    task: Any = None

    @property
    def name(self) -> str:
        """Return e.g. ``redis-list+results``."""
        return f"{self.entry}{'+results' if self.results else ''}"


async def _kick_many(task: Any, n: int, in_flight: int = IN_FLIGHT) -> Any:
    """Kick tasks 0..n-1, ``in_flight`` at a time concurrently; return the last handle."""
    last = None
    for first in range(0, n, in_flight):
        handles = await asyncio.gather(
            *(task.kiq(i) for i in range(first, min(n, first + in_flight)))
        )
        last = handles[-1]
    return last


async def _reach(state: WorkerState, target: int, timeout: float = 300.0) -> Report:
    state.expect(target)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, state.wait, timeout)


async def measure_combo(
    combo: Combo, server: Server, hub: SignalHub, n: int, latency_n: int, rep: int
) -> dict[str, Any]:
    """Run pre-load, drain, end-to-end and latency of one combo once."""
    stats = server.stats()
    task = combo.task
    out: dict[str, Any] = {
        "section": "taskiq",
        "entry": combo.entry,
        "results": combo.results,
        "rep": rep,
        "tasks": n,
    }
    phases: dict[str, float] = {}
    out["phase_s"] = phases
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = round(now - mark, 3)
        mark = now

    # 1. pre-load with no worker running
    before = stats.snapshot()
    with ClientCounter() as kick_counter:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await _kick_many(task, n)
        kick_secs = time.perf_counter() - t0
        kick_cpu = time.process_time() - cpu0
    kick_delta = stats.delta(before, stats.snapshot())
    out.update(
        kick_per_s=n / kick_secs,
        kick_cpu_ms_per_task=kick_cpu / n * 1000,
        kick_rt_per_task=kick_counter.round_trips / n,
        kick_server_cmds_per_task=kick_delta.total / n,
    )
    lap("preload")

    # 2. drain, from "ready" to the N-th saved task
    worker = Worker(combo, server.url, hub, RESULTS_DIR / "logs")
    try:
        ready = await worker.ready()
        lap("start")
        before = stats.snapshot()
        done = await _reach(worker.state, n)
        await asyncio.sleep(0.1)  # let the last acks land
        consume = stats.delta(before, stats.snapshot())
        out.update(
            drain_per_s=n / (done.at - ready.at),
            worker_cpu_ms_per_task=(done.cpu_ns - ready.cpu_ns) / n / 1e6,
            consume_rt_per_task=(done.round_trips - ready.round_trips) / n,
            consume_client_cmds_per_task=(done.commands - ready.commands) / n,
            consume_server_cmds_per_task=consume.total / n,
            consume_scripts_per_task=consume.scripts / n,
        )
        lap("drain")

        # 3. end-to-end: kick while the worker consumes
        before = stats.snapshot()
        base = worker.state.count
        server_cpu0 = server.cpu_seconds()
        t0 = time.perf_counter()
        reach = asyncio.ensure_future(_reach(worker.state, base + n))
        last = await _kick_many(task, n)
        kicked = time.perf_counter()
        done_e2e = await reach
        server_cpu = server.cpu_seconds() - server_cpu0
        await asyncio.sleep(0.1)
        delta = stats.delta(before, stats.snapshot())
        out.update(
            e2e_per_s=n / (done_e2e.at - t0),
            e2e_kick_per_s=n / (kicked - t0),
            e2e_server_cmds_per_task=delta.total / n,
            e2e_server_cpu_ms_per_task=server_cpu / n * 1000,
            e2e_worker_cpu_ms_per_task=(done_e2e.cpu_ns - done.cpu_ns) / n / 1e6,
        )
        if combo.results:
            got = await last.get_result()
            out["result_ok"] = got.return_value == n - 1
        lap("e2e")

        # 4. kick-to-result latency
        if combo.results and latency_n:
            lat = []
            for i in range(latency_n):
                t0 = time.perf_counter()
                handle = await task.kiq(i)
                res = await handle.wait_result(check_interval=LATENCY_POLL, timeout=30)
                lat.append((time.perf_counter() - t0) * 1000)
                if res.return_value != i:
                    out["result_ok"] = False
            out.update(latency_p50_ms=percentile(lat, 50), latency_p99_ms=percentile(lat, 99))
        lap("latency")
        await asyncio.sleep(0.05)
        total = 2 * n + (latency_n if combo.results else 0)
        out["duplicates"] = worker.state.count - total
    finally:
        worker.stop()
        lap("stop")
    return out


async def _start_producers(
    server: Server, progress: Progress
) -> tuple[list[Combo], dict[str, str]]:
    import taskiq_app

    skipped: dict[str, str] = {}
    combos: list[Combo] = []
    for entry in taskiq_app.ENTRIES:
        why = taskiq_app.availability(entry.key)
        if why is not None:
            skipped[entry.label] = why
            continue
        for results in entry.results:
            combo = Combo(entry.key, entry.label, results)
            combo.key = f"tq-{entry.key}-{'r' if results else 'n'}-{uuid.uuid4().hex[:6]}"
            progress.note(f"starting producer {combo.name}")
            try:
                combo.producer = taskiq_app.make_broker(
                    combo.entry, server.url, combo.key, combo.results
                )
                await combo.producer.startup()
                combo.task = combo.producer.find_task(taskiq_app.TASK_NAME)
            except Exception as exc:  # noqa: BLE001 - one broken entry must not stop the others
                skipped[f"{entry.label} (results {'on' if results else 'off'})"] = (
                    f"cannot start: {type(exc).__name__}: {exc}"
                )
                continue
            combos.append(combo)
    return combos, skipped


async def _run(
    server: Server, n: int, latency_n: int, reps: int, progress: Progress, emit: Any
) -> dict[str, Any]:
    hub = SignalHub()
    (RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
    combos, skipped = await _start_producers(server, progress)
    samples: dict[str, list[dict[str, Any]]] = {c.name: [] for c in combos}
    failed: set[str] = set()
    try:
        for rep in range(reps):
            for combo in rotated(combos, rep):
                if combo.name in failed:
                    progress.step(f"taskiq / {combo.name} skipped")
                    continue
                progress.note(f"taskiq / {combo.name} rep {rep + 1}")
                try:
                    sample = await measure_combo(combo, server, hub, n, latency_n, rep)
                except Exception as exc:  # noqa: BLE001 - one broken entry must not stop the others
                    failed.add(combo.name)
                    skipped[f"{combo.label} (results {'on' if combo.results else 'off'})"] = (
                        f"failed in rep {rep + 1}: {type(exc).__name__}: {exc}"
                    )
                    progress.step(f"taskiq / {combo.name} failed")
                    continue
                samples[combo.name].append(sample)
                emit(sample)
                progress.step(f"taskiq / {combo.name} rep {rep + 1}")
    finally:
        for combo in combos:
            with contextlib.suppress(Exception):
                await combo.producer.shutdown()
        hub.close()
    keys = (
        "e2e_per_s",
        "e2e_kick_per_s",
        "kick_per_s",
        "kick_cpu_ms_per_task",
        "e2e_server_cpu_ms_per_task",
        "e2e_server_cmds_per_task",
        "e2e_worker_cpu_ms_per_task",
        "kick_rt_per_task",
        "kick_server_cmds_per_task",
        "drain_per_s",
        "worker_cpu_ms_per_task",
        "consume_rt_per_task",
        "consume_client_cmds_per_task",
        "consume_server_cmds_per_task",
        "consume_scripts_per_task",
        "latency_p50_ms",
        "latency_p99_ms",
    )
    rows: dict[str, Any] = {}
    for combo in combos:
        got = samples[combo.name]
        if combo.name in failed or not got:
            continue
        rows[combo.name] = {
            "entry": combo.entry,
            "label": combo.label,
            "results": combo.results,
            **{k: median(s.get(k) for s in got) for k in keys},
            "duplicates": sum(s["duplicates"] for s in got),
            "result_ok": all(s.get("result_ok", True) for s in got),
        }
    return {"tasks": n, "latency_calls": latency_n, "rows": rows, "skipped": skipped}


def plan_units(reps: int) -> int:
    """Progress units of the section."""
    import taskiq_app

    live = sum(len(e.results) for e in taskiq_app.ENTRIES if taskiq_app.availability(e.key) is None)
    return max(1, live * reps)


def run_section(
    server: Server, *, reps: int, quick: bool, progress: Progress, emit: Any
) -> dict[str, Any]:
    """Run the Taskiq section; return its summary."""
    n = 500 if quick else 5000
    latency_n = 30 if quick else 200
    return asyncio.run(_run(server, n, latency_n, reps, progress, emit))


# -- reporting ------------------------------------------------------------------------------------


def report(summary: dict[str, Any], markdown: bool = False) -> str:
    """Render the Taskiq tables (rates and latency; cost per task)."""
    rows_in = summary["rows"]
    if not rows_in:
        text = "No Taskiq broker could run."
    else:
        base = _baseline(rows_in)
        rates, costs = [], []
        for _, row in in_order(rows_in, row_order()):
            ref = base.get(row["results"])
            label = row["label"]
            if row["duplicates"]:
                label += f" [{row['duplicates']} DUPLICATE]"
            if not row["result_ok"]:
                label += " [WRONG RESULT]"
            results = "on" if row["results"] else "off"
            rates.append(
                [
                    label,
                    results,
                    fmt_num(row["e2e_per_s"]),
                    fmt_ratio(row["e2e_per_s"] / ref if ref else None),
                    fmt_num(row["drain_per_s"]),
                    fmt_num(row["kick_per_s"]),
                    fmt_num(row["latency_p50_ms"]),
                    fmt_num(row["latency_p99_ms"]),
                ]
            )
            costs.append(
                [
                    label,
                    results,
                    fmt_num(row["worker_cpu_ms_per_task"]),
                    fmt_num(row["kick_cpu_ms_per_task"]),
                    fmt_num(row["e2e_server_cpu_ms_per_task"]),
                    fmt_num(row["consume_rt_per_task"]),
                    fmt_num(row["consume_server_cmds_per_task"]),
                    fmt_num(row["kick_rt_per_task"]),
                    fmt_num(row["kick_server_cmds_per_task"]),
                ]
            )
        text = (
            f"Taskiq: one `taskiq worker --workers 1`, trivial async task, {summary['tasks']:,} "
            f"tasks per phase, the producer keeps {IN_FLIGHT} kicks in flight; kick/s = "
            "producer alone; kick-to-result over "
            f"{summary['latency_calls']} sequential calls (wait_result polling every "
            f"{LATENCY_POLL * 1000:g} ms); 'vs base' = e2e rate relative to "
            "taskiq-redis-streams (taskiq-redis RedisStreamBroker when it did not run) "
            "with the same results setting\n\n"
            + render_table(
                [
                    "broker",
                    "results",
                    "e2e tasks/s",
                    "vs base",
                    "drain tasks/s",
                    "kick/s",
                    "kick-to-result p50 ms",
                    "p99 ms",
                ],
                rates,
                markdown,
            )
            + "\n\nCost per task (CPU in ms: worker during the drain, producer while "
            "kicking, server during the end-to-end phase; RT = client round trips)\n\n"
            + render_table(
                [
                    "broker",
                    "results",
                    "worker CPU",
                    "producer CPU",
                    "server CPU",
                    "consume RT",
                    "consume server cmds",
                    "kick RT",
                    "kick server cmds",
                ],
                costs,
                markdown,
            )
        )
    if summary["skipped"]:
        notes = "\n".join(f"- {name}: {why}" for name, why in summary["skipped"].items())
        text += "\n\nNot measured:\n" + notes
    return text


def row_order() -> list[str]:
    """Return the combo names in table order (entries as listed, results off first)."""
    import taskiq_app

    return [
        f"{entry.key}{'+results' if results else ''}"
        for entry in taskiq_app.ENTRIES
        for results in entry.results
    ]


def _baseline(rows: dict[str, Any]) -> dict[bool, float]:
    """Return the comparison base's e2e rate per results setting.

    The base is taskiq-redis-streams (the broker the budget names), or
    taskiq-redis's RedisStreamBroker when it could not run.
    """
    out: dict[bool, float] = {}
    for entry in ("redis-stream", "redis-streams-pkg"):
        for row in rows.values():
            if row["entry"] == entry and row["e2e_per_s"]:
                out[row["results"]] = row["e2e_per_s"]
    return out
