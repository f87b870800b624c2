"""``make demo-protean``: two Protean workers, six orders, two consumer groups, a dead letter.

Without arguments it needs no server: the broker is a SQLite file,
``.demo/protean-shop.db``. ``--redis`` starts the bundled Valkey (as ``make
demo`` does) or uses ``$SIMPLEBROKER_REDIS_URL``. Then it starts two
workers (``protean_app.py worker``: Protean's engine), places six orders
(``protean_app.py place 6``: the outbox publishes them), waits until both
groups handled every order and the bouncing one is dead-lettered, shows
``broker list --stats`` and the dead letters, and stops the workers.
Worker logs: ``.demo/protean-worker-<n>.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from demo import DEMO, EXAMPLES, say, start_server, title

ORDERS = 6


def start_worker(number: int, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    log = DEMO / f"protean-worker-{number}.log"
    worker = subprocess.Popen(
        [sys.executable, "protean_app.py", "worker"],
        cwd=EXAMPLES,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    say(f"started `python protean_app.py worker` (pid {worker.pid}); log: {log}")
    return worker, log


def wait_for(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def storage() -> tuple[str, object | None]:
    """Return (broker URI, server or None): a SQLite file, or Valkey with --redis."""
    if "--redis" in sys.argv:
        return start_server()
    for stale in DEMO.glob("protean-shop.db*"):
        if stale.is_file():
            stale.unlink()
    uri = str(DEMO / "protean-shop.db")
    say(f"broker: the SQLite file {uri} (no server)")
    return uri, None


def show_dead_letters(uri: str) -> None:
    sys.path.insert(0, str(EXAMPLES))
    os.environ["SHOP_BROKER_URI"] = uri
    import protean_app

    protean_app.domain.init(traverse=False)
    with protean_app.domain.domain_context():
        broker = protean_app.domain.brokers["default"]
        wait_for("the dead letter", lambda: broker.dlq_depth("shop::order:dlq") == 1)
        title("dead letters (broker.dlq_list)")
        for entry in broker.dlq_list(["shop::order:dlq"]):
            email = entry.payload["data"]["email"]
            say(f"{entry.dlq_id}: {entry.consumer_group} gave up on {email}")


def show_queues(uri: str, server: object | None) -> None:
    title("broker list --stats")
    if server is None:
        where = ["-d", str(DEMO), "-f", "protean-shop.db"]
    else:
        where = []
        (DEMO / ".broker.toml").write_text(
            f'version = 1\nbackend = "redis"\ntarget = "{uri}"\n'
            '[backend_options]\nnamespace = "shop"\n'
        )
    cli = str(Path(sys.executable).with_name("broker"))
    shown = subprocess.run(
        [cli, *where, "list", "--stats"], cwd=DEMO, capture_output=True, text=True
    )
    for line in (shown.stdout or shown.stderr).splitlines():
        say(f"  {line}")


def main() -> int:
    DEMO.mkdir(exist_ok=True)
    uri, server = storage()
    env = {**os.environ, "SHOP_BROKER_URI": uri, "PYTHONPATH": str(EXAMPLES)}
    workers = []
    try:
        title("workers")
        workers = [start_worker(n, env) for n in (1, 2)]
        for _, log in workers:
            wait_for(log.name, lambda log=log: "worker ready" in log.read_text())
        title("orders")
        place = [sys.executable, "protean_app.py", "place", str(ORDERS)]
        subprocess.run(place, cwd=EXAMPLES, env=env, check=True)

        def lines(tag: str) -> list[str]:
            return [
                line for _, log in workers for line in log.read_text().splitlines() if tag in line
            ]

        wait_for(
            "both groups",
            lambda: len(lines("[stock")) == ORDERS and len(lines("[mailer")) == ORDERS - 1,
        )
        for line in lines("[mailer") + lines("[stock"):
            say(line)
        show_dead_letters(uri)
        show_queues(uri, server)
    finally:
        for worker, _ in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)  # Protean's graceful shutdown
                worker.wait(60)
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
