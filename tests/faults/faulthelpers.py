"""What only the fault suite uses: which connections a process holds, leaked secrets, the CLI.

Stored state, invariants and waits are shared by the whole suite: see
``tests/support/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis


def backend_connections(raw: redis.Redis, pid: int | None = None) -> list[dict[str, Any]]:
    """Return CLIENT LIST entries of this process's backend connections (Pub/Sub included)."""
    owner = os.getpid() if pid is None else pid
    names = {f"simplebroker-redis:{owner}", f"simplebroker-redis-wake:{owner}"}
    return [client for client in raw.client_list() if client.get("name") in names]


@contextmanager
def watch_backend_ports(admins: Sequence[redis.Redis]) -> Iterator[set[tuple[str, int]]]:
    """Yield a set that fills, while the block runs, with this process's backend connections.

    Each is ``(kind, server port)``, kind ``command`` or ``wake`` (Pub/Sub),
    read from CLIENT LIST of every ``admins`` server every 50 ms and once
    more at the end (pooled connections still open then are seen however
    short the block): a test can then tell which port (TLS or plain) each
    kind of connection used.
    """
    seen: set[tuple[str, int]] = set()
    done = threading.Event()

    def poll_once() -> None:
        for admin in admins:
            for client in backend_connections(admin):
                wake = client["name"].startswith("simplebroker-redis-wake:")
                kind = "wake" if wake else "command"
                seen.add((kind, int(client["laddr"].rsplit(":", 1)[1])))

    def poll() -> None:
        while not done.is_set():
            poll_once()
            done.wait(0.05)

    watcher = threading.Thread(target=poll, daemon=True, name="watch-backend-ports")
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(10)
    poll_once()


# -- passwords and the CLI ---------------------------------------------------------------

#: A password with every character that needs quoting in a URL.
SECRET = "pa:ss/w@rd%?#-" + uuid.uuid4().hex[:8]
QUOTED = quote(SECRET, safe="")


def texts_of(exc: BaseException) -> str:
    """Return everything an exception can show: str, repr, the formatted chain."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


def assert_secret_free(*texts: str) -> None:
    """Fail if any text shows SECRET (raw or URL-quoted) or the wrong password hunter2."""
    for text in texts:
        for form in (SECRET, QUOTED, "hunter2"):
            assert form not in text, (
                f"password leaked: ...{text[max(0, text.find(form) - 60) :][:160]}"
            )


def broker_cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run SimpleBroker's ``broker`` CLI in ``cwd`` (extra environment in ``env``)."""
    cli = Path(sys.executable).with_name("broker")
    return subprocess.run(
        [str(cli), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def write_project(
    directory: Path, target: str, namespace: str, *, scripting: str = "functions"
) -> Path:
    """Write a ``.broker.toml`` for the redis backend into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{target}"\n\n'
        f'[backend_options]\nnamespace = "{namespace}"\nscripting = "{scripting}"\n',
        encoding="utf-8",
    )
    return directory
