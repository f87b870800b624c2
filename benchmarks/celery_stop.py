"""How long an idle prefork ``celery worker`` takes to exit on SIGTERM: ours versus Celery's Redis.

``python benchmarks/celery_stop.py [--rounds N] [--idle S]``

Each round starts ``celery -A <app> worker`` (the default prefork pool, one
process per core) with the README's quickstart settings (results on,
``task_acks_late``), once on ``simplebroker+redis://`` and once on Celery's
own ``redis://`` transport and result backend, on one throwaway server; runs
one task, leaves the worker idle for ``--idle`` seconds, sends SIGTERM to
its process group and times:

- ``pool``: from SIGTERM to the end of Celery's "Stopping Pool" step (its
  AsynPool stopping the pool processes);
- ``exit``: from SIGTERM to the worker's exit (the interpreter's exit too).

The README's and docs/celery.md's figures come from here. Prints only; not
part of ``run.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simplebroker_redis.devserver import DevServer

#: The app the workers and the producer load (the README's quickstart, URL from the environment).
APP = """
import os
from celery import Celery
import celery_simplebroker  # noqa: F401

app = Celery("stopapp")
app.conf.broker_url = app.conf.result_backend = os.environ["STOP_URL"]
app.conf.broker_transport_options = {"namespace": "stop"}
app.conf.result_backend_transport_options = {"namespace": "stop"}
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True


@app.task
def add(a, b):
    return a + b
"""

SCHEMES = {"simplebroker": "simplebroker+redis", "redis": "redis"}


def one_stop(folder: Path, url: str, idle: float) -> tuple[float, float]:
    """Start a worker on ``url``, run a task, idle, SIGTERM it: (pool seconds, exit seconds)."""
    env = {**os.environ, "STOP_URL": url, "PYTHONPATH": str(folder)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stopapp", "worker", "--loglevel", "DEBUG"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=folder,
        start_new_session=True,
    )
    assert worker.stdout is not None
    for line in worker.stdout:
        if "ready." in line:
            break
    sent = subprocess.run(
        [sys.executable, "-c", "from stopapp import add; print(add.delay(1, 2).get(timeout=30))"],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert sent.stdout.strip() == "3", sent
    time.sleep(idle)
    asked = time.monotonic()
    os.killpg(worker.pid, signal.SIGTERM)
    pool = float("nan")
    for line in worker.stdout:
        if "Stopping Hub" in line:  # the step after "Stopping Pool"
            pool = time.monotonic() - asked
    worker.wait(60)
    return pool, time.monotonic() - asked


def main() -> None:
    """Run the rounds and print each, then the medians and ranges."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=float, default=2.0)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in SCHEMES}
    with tempfile.TemporaryDirectory() as folder, DevServer() as server:
        Path(folder, "stopapp.py").write_text(APP, encoding="utf-8")
        for _ in range(args.rounds):
            for name, scheme in SCHEMES.items():
                url = f"{scheme}://127.0.0.1:{server.port}/{0 if name == 'simplebroker' else 1}"
                pool, exited = one_stop(Path(folder), url, args.idle)
                times[name].append((pool, exited))
                print(f"{name:13s} pool {pool:5.2f} s  exit {exited:5.2f} s", flush=True)
    print(f"\ncores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    for name, rows in times.items():
        exits = [exited for _, exited in rows]
        pools = [pool for pool, _ in rows]
        spread = f"{min(exits):.2f}-{max(exits):.2f}"
        print(
            f"{name:13s} exit median {statistics.median(exits):.2f} s ({spread}), "
            f"pool stop median {statistics.median(pools):.2f} s"
        )


if __name__ == "__main__":
    main()
