"""``make demo-celery``: a local Valkey, a ``celery worker``, tasks and their results.

Without ``SIMPLEBROKER_REDIS_URL`` it starts the Valkey binary bundled with the
``dev`` extra (AOF, ``appendfsync always``) in ``.demo/valkey``; with it, it
uses that server. Then it starts ``celery -A celery_app worker`` in examples/,
sends tasks (a sum, a group, a chord, a countdown task shown by ``broker
peek`` while the worker holds it, a task longer than the lease), pings the
worker, and stops everything again. The worker's log is
``.demo/celery-worker.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from demo import DEMO, EXAMPLES, import_path, say, start_server, title, write_project_config

#: Celery's default pool (prefork), with two pool processes; ``-P threads``,
#: ``solo``, ``gevent`` and ``eventlet`` work too (docs/celery.md).
POOL = ["-c", "2"]


def start_worker(url: str, pythonpath: str) -> subprocess.Popen[bytes]:
    log = (DEMO / "celery-worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", *POOL],
        cwd=EXAMPLES,
        env={**os.environ, "SIMPLEBROKER_REDIS_URL": url, "PYTHONPATH": pythonpath},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    command = " ".join(["celery -A celery_app worker", *POOL])
    say(f"started `{command}` (pid {worker.pid}); log: {log.name}")
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    started = time.perf_counter()
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)  # warm shutdown, as a supervisor asks
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)
            say("the worker did not stop within 30 s of SIGTERM: killed")
    elapsed = time.perf_counter() - started
    say(f"worker stopped {elapsed:.1f} s after SIGTERM (exit code {worker.returncode})")


def peek(queue: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "simplebroker", "peek", "--all", queue],
        cwd=DEMO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    say(f"$ cd .demo && broker peek --all {queue}")
    for line in (shown.stdout or shown.stderr).splitlines():
        say(f"  {line[:150]}{'...' if len(line) > 150 else ''}")


def run_tasks() -> None:
    from celery import chord, group
    from celery_app import add, app, slow

    title("worker ready?")
    deadline = time.monotonic() + 60
    while not (replies := app.control.inspect(timeout=1).ping()):
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not answer `celery inspect ping`")
    say(f"celery inspect ping: {replies}")

    title("tasks")
    started = time.perf_counter()
    say(f"add(2, 3) = {add.delay(2, 3).get(timeout=30)}  ({time.perf_counter() - started:.3f} s)")
    say(f"group of 10 adds = {group(add.s(i, i) for i in range(10))().get(timeout=30)}")
    total = chord(add.s(i, 1) for i in range(5))(app.signature("celery_app.tsum"))
    say(f"chord: sum of 5 header results, body dispatched once = {total.get(timeout=30)}")

    later = add.apply_async((40, 2), countdown=4)
    time.sleep(1)
    say("a countdown task waits in the worker, under a renewed lease:")
    peek("celery")
    say(f"... and runs on time: {later.get(timeout=30)}")

    say(f"slow(12), longer than the 10 s lease: {slow.delay(12).get(timeout=60)} (ran once)")

    title("throughput")
    started = time.perf_counter()
    results = group(add.s(i, i) for i in range(300))().get(timeout=120)
    elapsed = time.perf_counter() - started
    say(f"300 tasks with results in {elapsed:.2f} s ({len(results) / elapsed:.0f} tasks/s)")
    app.close()  # its broker connections (the inspect replies' consumer included)


def main() -> int:
    """Run the demo; 0 when every step worked."""
    DEMO.mkdir(exist_ok=True)
    pythonpath = import_path()
    title("server")
    url, server = start_server()
    os.environ["SIMPLEBROKER_REDIS_URL"] = url  # celery_app reads it at import
    write_project_config(url)
    worker = None
    started = time.perf_counter()
    try:
        title("worker")
        worker = start_worker(url, pythonpath)
        run_tasks()
    except Exception as exc:  # noqa: BLE001 - report and clean up
        print(f"\ndemo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        log = DEMO / "celery-worker.log"
        if log.exists():
            print(log.read_text()[-3000:], file=sys.stderr)
        return 1
    finally:
        title("stopping")
        if worker is not None:
            stop_worker(worker)
        if server is not None:
            # This process's idle wake-up connections close first, quietly.
            from simplebroker_redis.activity import close_idle_listeners

            close_idle_listeners()
            server.stop(remove_data=False)  # type: ignore[attr-defined]
            say("server stopped; its data stays in .demo/valkey")
    print(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
