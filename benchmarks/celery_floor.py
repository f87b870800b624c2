"""Worker CPU per task: Celery's own floor versus a worker on a real transport.

``python benchmarks/celery_floor.py [--tasks N]``

Drains N pre-sent trivial tasks (results on, acks_late, ``-P solo``
semantics) with a Celery worker started in this process, and reports the
rate and this process's CPU per task from the first to the last task
(``task_postrun``), for:

- ``memory``: kombu's in-memory transport and Celery's ``cache+memory://``
  result backend, no server: what Celery itself costs per task;
- ``simplebroker`` and ``redis``: this package's transport and result
  backend, and Celery's Redis ones, on a throwaway server (the apps of
  :mod:`celery_app`).

The difference to ``memory`` is what a transport and result backend cost
in the worker. Each entry runs in a fresh process. Not part of ``run.py``;
prints only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

ENTRIES = ("memory", "simplebroker", "redis")


def drain(entry: str, url: str, tasks: int) -> str:
    """Run in a child process: send ``tasks`` tasks, drain them in-process, report."""
    import celery_app
    from celery import Celery, signals

    if entry == "memory":
        app = Celery("floor", broker="memory://", backend="cache+memory://")
        app.conf.update(task_acks_late=True, worker_hijack_root_logger=False)

        @app.task(name="add", shared=False)
        def add(a: int, b: int) -> int:
            return a + b

    else:
        app = celery_app.make_app(entry, url, "floor")
    done = threading.Event()
    marks: list[tuple[float, float]] = []

    @signals.task_postrun.connect(weak=False)
    def finished(**kwargs: object) -> None:
        marks.append((time.perf_counter(), time.process_time()))
        if len(marks) == tasks:
            done.set()

    for i in range(tasks):
        app.send_task("add", (i, i), queue="floor")
    worker = app.Worker(
        pool="solo",
        concurrency=1,
        queues=["floor"],
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        loglevel="WARNING",
        quiet=True,
    )
    threading.Thread(target=worker.start, daemon=True).start()
    if not done.wait(300):
        return f"{entry}: only {len(marks)} of {tasks} tasks in 300 s"
    (t0, c0), (t1, c1) = marks[0], marks[-1]
    return (
        f"{entry:>12}: {(tasks - 1) / (t1 - t0):7,.0f} tasks/s, "
        f"{(c1 - c0) / (tasks - 1) * 1000:.3f} ms CPU per task (whole worker process)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--child", nargs=2, metavar=("ENTRY", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # The worker redirects sys.stdout to its logger; the figure goes to the real one.
        sys.__stdout__.write(drain(args.child[0], args.child[1], args.tasks) + "\n")
        sys.__stdout__.flush()
        os._exit(0)  # the in-process worker has non-daemon parts; the figure is printed
    from common import Server

    with Server() as server:
        for entry in ENTRIES:
            command = [sys.executable, __file__, "--tasks", str(args.tasks)]
            child = subprocess.run(
                [*command, "--child", entry, server.url],
                capture_output=True,
                text=True,
                timeout=600,
            )
            lines = [line for line in child.stdout.splitlines() if line.strip()]
            print(lines[-1] if lines else f"{entry}: failed\n{child.stderr[-2000:]}")


if __name__ == "__main__":
    main()
