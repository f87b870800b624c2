"""``make demo``: a local Valkey, a Taskiq worker, tasks with progress and results.

Without ``SIMPLEBROKER_REDIS_URL`` it starts the Valkey binary bundled with
the ``dev`` extra (no Redis installation needed) with AOF persistence
(``appendfsync always``) in ``.demo/valkey``; with it, it uses that server.
Then it starts ``taskiq worker taskiq_app:broker``, kicks tasks (see
producer.py), shows a delayed task through ``broker peek``, runs a plain
SimpleBroker queue, and stops everything again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEMO = ROOT / ".demo"
DEMO_PORT = 6390  # matches examples/.broker.toml


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def title(text: str) -> None:
    print(f"\n== {text}", flush=True)


def import_path() -> str:
    """Make the example modules importable here and in the worker."""
    paths = [str(EXAMPLES)]
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    return os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_server() -> tuple[str, object | None]:
    """Return (url, server): the user's server, or a local Valkey with AOF."""
    url = os.environ.get("SIMPLEBROKER_REDIS_URL")
    if url:
        say(f"using SIMPLEBROKER_REDIS_URL={url}")
        return url, None
    from simplebroker_redis.devserver import DevServer

    server = DevServer(
        data_dir=str(DEMO / "valkey"),
        port=DEMO_PORT if port_is_free(DEMO_PORT) else None,
        appendonly=True,
        extra_args=["--appendfsync", "always"],
    )
    server.start()
    say(f"started {Path(server.binary).name} at {server.url} (AOF, fsync always)")
    say(f"data: {server.data_dir}")
    return server.url, server


def write_project_config(url: str) -> None:
    (DEMO / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{url}"\n', encoding="utf-8"
    )


def start_worker(url: str, pythonpath: str) -> subprocess.Popen[bytes]:
    log = (DEMO / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "taskiq", "worker", "taskiq_app:broker", "--workers", "1"],
        cwd=EXAMPLES,
        env={**os.environ, "SIMPLEBROKER_REDIS_URL": url, "PYTHONPATH": pythonpath},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    say(f"started `taskiq worker taskiq_app:broker` (pid {worker.pid}); log: {log.name}")
    return worker


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)  # what a supervisor sends
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)
    say(f"worker stopped (exit code {worker.returncode})")


def peek() -> None:
    """Show the waiting tasks as SimpleBroker sees them (`broker peek`)."""
    shown = subprocess.run(
        [sys.executable, "-m", "simplebroker", "peek", "--all", "taskiq"],
        cwd=DEMO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    say("$ cd .demo && broker peek --all taskiq")
    for line in (shown.stdout or shown.stderr).splitlines():
        say(f"  {line[:150]}{'...' if len(line) > 150 else ''}")


def main() -> int:
    """Run the demo; 0 when every step worked."""
    DEMO.mkdir(exist_ok=True)
    pythonpath = import_path()
    title("server")
    url, server = start_server()
    os.environ["SIMPLEBROKER_REDIS_URL"] = url  # taskiq_app reads it at import
    write_project_config(url)
    worker = None
    started = time.perf_counter()
    try:
        title("worker")
        worker = start_worker(url, pythonpath)
        import producer
        import simplebroker_queue

        title("tasks (producer.py)")
        asyncio.run(_produce(producer))
        title("a plain SimpleBroker queue on the same namespace")
        simplebroker_queue.run(say)
    except Exception as exc:  # noqa: BLE001 - report and clean up
        print(f"\ndemo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        if (DEMO / "worker.log").exists():
            print((DEMO / "worker.log").read_text()[-3000:], file=sys.stderr)
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


async def _produce(producer) -> None:
    await producer.broker.startup()
    try:
        await producer.run(say, while_delayed=peek)
    finally:
        await producer.broker.shutdown()


if __name__ == "__main__":
    sys.exit(main())
