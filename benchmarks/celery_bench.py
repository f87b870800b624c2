"""Celery benchmarks: this transport and result backend vs Celery's own Redis ones.

Entries are defined in :mod:`celery_app`. Per repetition, entries
interleaved in an order rotated every repetition:

1. **throughput** (``simplebroker``, ``redis``): a fresh ``celery worker -P
   solo`` (Celery's default prefetch multiplier, 4) on a queue of its own;
   the producer sends N ``add`` tasks with results from one thread
   (``send_task``) while the worker runs. End-to-end rate = N / (first
   send .. N-th task done, its result stored); send rate; worker CPU per
   task (from ready to the N-th task done) and server CPU per task. Then M
   sequential ``send_task(...).get()`` calls (send-to-result latency);
   then the worker is killed.
2. **recovery** (all three entries, run concurrently within a repetition:
   the measured times are seconds, and the waits overlap): worker A (``-P
   threads -c 4``) starts K tasks that would sleep for an hour; worker B
   (``-P solo``) starts and is ready; A's process group is SIGKILLed. The
   time from the kill until B finished each of A's tasks, bounded by
   :data:`WAIT` seconds ("not within WAIT s" otherwise).

Progress comes from the workers' signal handlers over a local socket
(``ready``, ``start``, ``done`` with the process's CPU time), never by
polling Redis. A throughput worker reports only ``ready`` and its N-th
finished task (``nth``): two lines per task would load the worker and the
producer's process with work neither transport does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common import (
    HERE,
    RESULTS_DIR,
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

#: Entries of the throughput measurement, and of the recovery measurement.
THROUGHPUT = ("simplebroker", "redis")
RECOVERY = ("simplebroker", "redis", "redis-vt10")

#: Tasks the killed worker holds in the recovery measurement.
HELD = 4

#: Longest wait for a killed worker's tasks to run again (seconds).
WAIT = 30.0


# -- reports from the workers -------------------------------------------------------------------


@dataclass
class WorkerLog:
    """What one worker process reported: (arrival time, CPU ns) per event."""

    ready: tuple[float, int] | None = None
    started: dict[str, float] = field(default_factory=dict)
    done: dict[str, tuple[float, int]] = field(default_factory=dict)
    count: int = 0
    nth: dict[int, tuple[float, int]] = field(default_factory=dict)  #: armed count -> report


class Hub(LineHub):
    """Local TCP server receiving the workers' lines: ``<tag> <kind> <task id> <cpu ns>``."""

    def __init__(self) -> None:
        self.logs: dict[str, WorkerLog] = {}
        self.cond = threading.Condition()
        self._armed: dict[str, int] = {}
        super().__init__(backlog=32)

    def log(self, tag: str) -> WorkerLog:
        with self.cond:
            return self.logs.setdefault(tag, WorkerLog())

    def arm(self, tag: str, count: int) -> None:
        """Record the report that brings worker ``tag``'s done count to ``count``."""
        with self.cond:
            self._armed[tag] = count

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (called under the lock) holds; False on timeout."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def handle(self, now: float, lines: list[list[str]], peer: dict[str, Any]) -> None:
        with self.cond:
            for words in lines:
                self._record(now, *words)
            self.cond.notify_all()

    def _record(self, now: float, tag: str, kind: str, task_id: str, cpu: str) -> None:
        log = self.logs.setdefault(tag, WorkerLog())
        if kind == "ready":
            log.ready = (now, int(cpu))
        elif kind == "start":
            log.started[task_id] = now
        elif kind == "done":
            log.done[task_id] = (now, int(cpu))
            log.count += 1
            if log.count == self._armed.get(tag):
                log.nth[log.count] = (now, int(cpu))
        elif kind == "nth":  # a throughput worker: only its N-th finished task
            log.count = int(task_id)
            log.nth[log.count] = (now, int(cpu))


class Worker:
    """One ``celery worker`` process group of an entry."""

    def __init__(
        self,
        entry: str,
        server: Server,
        namespace: str,
        queue: str,
        hub: Hub,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        hold: float = 0.0,
        report_at: int | None = None,
    ) -> None:
        self.tag = f"{entry}-{uuid.uuid4().hex[:8]}"
        self.hub = hub
        env = {
            **os.environ,
            "BENCH_CELERY_ENTRY": entry,
            "BENCH_CELERY_URL": server.url,
            "BENCH_CELERY_NS": namespace,
            "BENCH_HUB_PORT": str(hub.port),
            "BENCH_TAG": self.tag,
            "BENCH_HOLD": str(hold),
            "BENCH_REPORT_AT": "" if report_at is None else str(report_at),
        }
        logs = RESULTS_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"celery-{self.tag}.log"
        self._out = self.log_path.open("wb")
        # Startup options that only add traffic between workers are off for every entry.
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "celery_app",
                "worker",
                "-P",
                pool,
                "-c",
                str(concurrency),
                "-Q",
                queue,
                "-n",
                f"{self.tag}@%h",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "--loglevel",
                "WARNING",
            ],
            cwd=str(HERE),
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def log(self) -> WorkerLog:
        return self.hub.log(self.tag)

    def ready(self, timeout: float = 90.0) -> tuple[float, int]:
        """Wait until the worker reported ready; return (time, CPU ns)."""
        deadline = time.monotonic() + timeout
        while not self.hub.wait(lambda: self.log.ready is not None, 0.5):
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker {self.tag} exited; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery worker {self.tag} did not start; see {self.log_path}")
        assert self.log.ready is not None
        return self.log.ready

    def kill(self) -> float:
        """SIGKILL the process group; return when (perf_counter)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        killed = time.perf_counter()
        self.proc.wait(10)
        self._out.close()
        return killed


# -- the measurements ---------------------------------------------------------------------------


def measure_throughput(
    entry: str, app: Any, server: Server, namespace: str, hub: Hub, n: int, m: int, rep: int
) -> dict[str, Any]:
    """One throughput sample of ``entry``."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    worker = Worker(entry, server, namespace, queue, hub, report_at=n)
    out: dict[str, Any] = {"section": "celery", "part": "throughput", "entry": entry, "rep": rep}
    try:
        _, ready_cpu = worker.ready()
        hub.arm(worker.tag, n)
        server_cpu0 = server.cpu_seconds()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        last = None
        for i in range(n):
            last = app.send_task("add", (i, i), queue=queue)
        sent = time.perf_counter()
        producer_cpu = time.process_time() - cpu0
        if not hub.wait(lambda: n in worker.log.nth, 300):
            raise RuntimeError(f"{entry}: {worker.log.count} of {n} tasks done in 300 s")
        done_at, done_cpu = worker.log.nth[n]
        server_cpu = server.cpu_seconds() - server_cpu0
        assert last is not None
        out.update(
            tasks=n,
            e2e_per_s=n / (done_at - t0),
            send_per_s=n / (sent - t0),
            worker_cpu_ms_per_task=(done_cpu - ready_cpu) / n / 1e6,
            producer_cpu_ms_per_task=producer_cpu / n * 1000,
            server_cpu_ms_per_task=server_cpu / n * 1000,
            result_ok=last.get(timeout=60) == 2 * (n - 1),
        )
        latencies = []
        for i in range(m):
            t = time.perf_counter()
            value = app.send_task("add", (i, 1), queue=queue).get(timeout=30)
            latencies.append((time.perf_counter() - t) * 1000)
            out["result_ok"] = out["result_ok"] and value == i + 1
        out.update(
            latency_p50_ms=percentile(latencies, 50), latency_p99_ms=percentile(latencies, 99)
        )
    finally:
        worker.kill()
    return out


def measure_recovery(
    entry: str, app: Any, server: Server, namespace: str, hub: Hub, wait: float, rep: int
) -> dict[str, Any]:
    """One recovery sample of ``entry``: SIGKILL a worker holding HELD running tasks."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {"section": "celery", "part": "recovery", "entry": entry, "rep": rep}
    holder = Worker(
        entry, server, namespace, queue, hub, pool="threads", concurrency=HELD, hold=3600
    )
    heir: Worker | None = None
    try:
        holder.ready()
        ids = [app.send_task("hold", queue=queue).id for _ in range(HELD)]
        if not hub.wait(lambda: all(i in holder.log.started for i in ids), 120):
            raise RuntimeError(f"{entry}: the holder did not start its {HELD} tasks")
        delivered = max(holder.log.started[i] for i in ids)
        heir = Worker(entry, server, namespace, queue, hub)
        heir.ready()
        early = [i for i in ids if i in heir.log.started]  # ran twice while the holder lived
        killed = holder.kill()
        hub.wait(lambda: all(i in heir.log.done for i in ids), wait)
        times = [heir.log.done[i][0] - killed for i in ids if i in heir.log.done]
        out.update(
            held=HELD,
            wait_s=wait,
            held_before_kill_s=killed - delivered,
            rerun=len(times),
            rerun_while_holder_lived=len(early),
            first_rerun_s=min(times) if times else None,
            all_rerun_s=max(times) if len(times) == HELD else None,
        )
    finally:
        holder.kill()
        if heir is not None:
            heir.kill()
    return out


def plan_units(reps: int) -> int:
    """Progress units of the section."""
    return reps * (len(THROUGHPUT) + 1)


def run_section(
    server: Server, *, reps: int, quick: bool, progress: Progress, emit: Any
) -> dict[str, Any]:
    """Run the Celery section; return its summary."""
    import celery_app

    n = 300 if quick else 3000
    m = 20 if quick else 100
    wait = 20.0 if quick else WAIT
    namespace = f"bench-celery-{uuid.uuid4().hex[:6]}"
    hub = Hub()
    apps = {entry: celery_app.make_app(entry, server.url, namespace) for entry in RECOVERY}
    throughput: dict[str, list[dict[str, Any]]] = {entry: [] for entry in THROUGHPUT}
    recovery: dict[str, list[dict[str, Any]]] = {entry: [] for entry in RECOVERY}
    failed: dict[str, str] = {}
    try:
        for rep in range(reps):
            for entry in rotated(THROUGHPUT, rep):
                progress.note(f"celery / throughput {entry} rep {rep + 1}")
                try:
                    sample = measure_throughput(
                        entry, apps[entry], server, namespace, hub, n, m, rep
                    )
                except Exception as exc:  # noqa: BLE001 - one broken entry must not stop the others
                    failed[f"throughput {entry} rep {rep + 1}"] = f"{type(exc).__name__}: {exc}"
                else:
                    throughput[entry].append(sample)
                    emit(sample)
                progress.step(f"celery / throughput {entry} rep {rep + 1}")
            progress.note(f"celery / recovery rep {rep + 1} (up to {wait:g} s)")
            samples: dict[str, dict[str, Any]] = {}

            def one(entry: str, rep: int = rep, samples: dict[str, Any] = samples) -> None:
                try:
                    samples[entry] = measure_recovery(
                        entry, apps[entry], server, namespace, hub, wait, rep
                    )
                except Exception as exc:  # noqa: BLE001 - reported, the others go on
                    failed[f"recovery {entry} rep {rep + 1}"] = f"{type(exc).__name__}: {exc}"

            threads = [threading.Thread(target=one, args=(entry,)) for entry in RECOVERY]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for entry in RECOVERY:
                if entry in samples:
                    recovery[entry].append(samples[entry])
                    emit(samples[entry])
            progress.step(f"celery / recovery rep {rep + 1}")
    finally:
        for app in apps.values():
            with contextlib.suppress(Exception):
                app.close()
        hub.close()
    return {
        "tasks": n,
        "latency_calls": m,
        "held": HELD,
        "wait_s": wait,
        "throughput": {e: _throughput_row(s) for e, s in throughput.items() if s},
        "recovery": {e: _recovery_row(s) for e, s in recovery.items() if s},
        "failed": failed,
    }


_THROUGHPUT_KEYS = (
    "e2e_per_s",
    "send_per_s",
    "worker_cpu_ms_per_task",
    "producer_cpu_ms_per_task",
    "server_cpu_ms_per_task",
    "latency_p50_ms",
    "latency_p99_ms",
)


def _throughput_row(samples: list[dict[str, Any]]) -> dict[str, Any]:
    row = {key: median(s.get(key) for s in samples) for key in _THROUGHPUT_KEYS}
    row["reps"] = len(samples)
    row["result_ok"] = all(s.get("result_ok") for s in samples)
    return row


def _recovery_row(samples: list[dict[str, Any]]) -> dict[str, Any]:
    complete = [s for s in samples if s["all_rerun_s"] is not None]
    return {
        "reps": len(samples),
        "complete_reps": len(complete),
        # A median over the repetitions where every task ran again; None when none did.
        "all_rerun_s": median(s["all_rerun_s"] for s in complete) if complete else None,
        "first_rerun_s": median(s["first_rerun_s"] for s in samples),
        "held_before_kill_s": median(s["held_before_kill_s"] for s in samples),
        "rerun_while_holder_lived": sum(s["rerun_while_holder_lived"] for s in samples),
        "wait_s": samples[0]["wait_s"],
    }


# -- reporting ------------------------------------------------------------------------------------


def _label(entry: str) -> str:
    import celery_app

    return next((e.label for e in celery_app.ENTRIES if e.key == entry), entry)


def report(summary: dict[str, Any], markdown: bool = False) -> str:
    """Render the Celery tables (throughput and cost; recovery after SIGKILL)."""
    parts = []
    rows = summary["throughput"]
    if rows:
        base = rows.get("redis", {}).get("e2e_per_s")
        table = []
        for entry, row in in_order(rows, list(THROUGHPUT)):
            label = _label(entry) + ("" if row["result_ok"] else " [WRONG RESULT]")
            table.append(
                [
                    label,
                    fmt_num(row["e2e_per_s"]),
                    fmt_ratio(row["e2e_per_s"] / base if base and row["e2e_per_s"] else None),
                    fmt_num(row["send_per_s"]),
                    fmt_num(row["worker_cpu_ms_per_task"]),
                    fmt_num(row["producer_cpu_ms_per_task"]),
                    fmt_num(row["server_cpu_ms_per_task"]),
                    fmt_num(row["latency_p50_ms"]),
                    fmt_num(row["latency_p99_ms"]),
                ]
            )
        parts.append(
            f"Celery throughput: one `celery worker -P solo` (prefetch multiplier 4, "
            f"acks_late), trivial task with results, {summary['tasks']:,} tasks sent from one "
            "thread while the worker runs; e2e = first send to last result stored; CPU in ms "
            f"per task; send-to-result over {summary['latency_calls']} sequential "
            "`send_task().get()` calls; 'vs Redis' = e2e rate relative to Celery's Redis "
            "transport and result backend\n\n"
            + render_table(
                [
                    "transport + result backend",
                    "e2e tasks/s",
                    "vs Redis",
                    "send/s",
                    "worker CPU",
                    "producer CPU",
                    "server CPU",
                    "send-to-result p50 ms",
                    "p99 ms",
                ],
                table,
                markdown,
            )
        )
    rows = summary["recovery"]
    if rows:
        table = []
        for entry, row in in_order(rows, list(RECOVERY)):
            wait = f"not within {row['wait_s']:g} s"
            table.append(
                [
                    _label(entry),
                    wait if row["all_rerun_s"] is None else fmt_num(row["all_rerun_s"]),
                    wait if row["first_rerun_s"] is None else fmt_num(row["first_rerun_s"]),
                    f"{row['complete_reps']}/{row['reps']}",
                    fmt_num(row["held_before_kill_s"]),
                    str(row["rerun_while_holder_lived"]),
                ]
            )
        parts.append(
            f"Celery recovery: a worker (`-P threads -c {summary['held']}`) running "
            f"{summary['held']} tasks is SIGKILLed while a second, idle worker runs; seconds "
            "from the kill until the second worker finished them (median of reps; the wait "
            f"is bounded at {summary['wait_s']:g} s). Celery's Redis transport restores "
            "unacknowledged messages only after `visibility_timeout`, one hour by default\n\n"
            + render_table(
                [
                    "transport",
                    "all tasks ran again, s",
                    "first, s",
                    "reps complete",
                    "held before kill, s",
                    "ran twice while holder lived",
                ],
                table,
                markdown,
            )
        )
    if not parts:
        parts.append("No Celery measurement could run.")
    text = "\n\n".join(parts)
    if summary["failed"]:
        notes = "\n".join(f"- {name}: {why}" for name, why in summary["failed"].items())
        text += "\n\nFailed:\n" + notes
    return text
