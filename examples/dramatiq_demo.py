"""``make demo-dramatiq``: a local Valkey, ``dramatiq`` workers, tasks and their results.

Without ``SIMPLEBROKER_REDIS_URL`` it starts the Valkey binary bundled with the
``dev`` extra (AOF, ``appendfsync always``) in ``.demo/valkey``; with it, it
uses that server. Then it starts ``dramatiq dramatiq_app --processes 2
--threads 4`` in examples/, sends tasks (sums, a delayed task shown by
``broker peek`` while it waits in the storage, a priority, a task longer
than the lease, a failing task that ends in the dead-letter queue), and
stops everything again. The worker's log is ``.demo/dramatiq-worker.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from demo import DEMO, EXAMPLES, import_path, say, start_server, title, write_project_config

WORKER = ["--processes", "2", "--threads", "4"]


def start_worker(url: str, pythonpath: str) -> subprocess.Popen[bytes]:
    log = (DEMO / "dramatiq-worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "dramatiq_app", *WORKER],
        cwd=EXAMPLES,
        env={**os.environ, "SIMPLEBROKER_REDIS_URL": url, "PYTHONPATH": pythonpath},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    say(f"started `dramatiq dramatiq_app {' '.join(WORKER)}` (pid {worker.pid}); log: {log.name}")
    deadline = time.monotonic() + 60
    while (DEMO / "dramatiq-worker.log").read_text().count("is ready for action") < 2:
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        time.sleep(0.1)
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    started = time.perf_counter()
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)
            say("the worker did not stop within 30 s of SIGTERM: killed")
    say(f"worker stopped {time.perf_counter() - started:.1f} s after SIGTERM")


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
    from dramatiq_app import add, broker, flaky, slow, urgent

    title("tasks")
    started = time.perf_counter()
    total = add.send(2, 3).get_result(block=True)
    say(f"add(2, 3) = {total}  ({time.perf_counter() - started:.3f} s)")
    later = add.send_with_options(args=(40, 2), delay=3000)
    say("a delayed message waits in the storage (no .DQ queue, no worker holds it):")
    peek("default")
    say(f"... and runs on time: {later.get_result(block=True, timeout=30_000)}")
    say(f"urgent('hi') (priority -1) = {urgent.send('hi').get_result(block=True)}")
    seconds = slow.send(12).get_result(block=True, timeout=60_000)
    say(f"slow(12), longer than the 10 s lease: {seconds} (ran once)")
    flaky.send()
    broker.join("default", timeout=30_000)
    say("flaky() failed 3 times (2 retries) and went to the dead-letter queue:")
    peek("default.XQ")

    title("throughput")
    started = time.perf_counter()
    messages = [add.send(i, i) for i in range(300)]
    results = [message.get_result(block=True, timeout=120_000) for message in messages]
    elapsed = time.perf_counter() - started
    say(f"300 tasks with results in {elapsed:.2f} s ({len(results) / elapsed:.0f} tasks/s)")
    broker.close()


def main() -> int:
    """Run the demo; 0 when every step worked."""
    DEMO.mkdir(exist_ok=True)
    pythonpath = import_path()
    title("server")
    url, server = start_server()
    os.environ["SIMPLEBROKER_REDIS_URL"] = url  # dramatiq_app reads it at import
    write_project_config(url)
    worker = None
    started = time.perf_counter()
    try:
        title("worker")
        worker = start_worker(url, pythonpath)
        run_tasks()
    except Exception as exc:  # noqa: BLE001 - report and clean up
        print(f"\ndemo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        log = DEMO / "dramatiq-worker.log"
        if log.exists():
            print(log.read_text()[-3000:], file=sys.stderr)
        return 1
    finally:
        title("stopping")
        if worker is not None:
            stop_worker(worker)
        if server is not None:
            from simplebroker_redis.activity import close_idle_listeners

            close_idle_listeners()
            server.stop(remove_data=False)  # type: ignore[attr-defined]
            say("server stopped; its data stays in .demo/valkey")
    print(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
