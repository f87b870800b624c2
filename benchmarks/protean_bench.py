"""Protean section: this project's broker provider against Protean's own.

Per repetition, entries interleaved in an order rotated every repetition,
each on a stream of its own:

- on one Valkey server: ``simplebroker`` (this provider, Redis) and
  Protean's ``redis`` provider (Redis Streams);
- in the process: ``simplebroker`` on a SQLite file and Protean's
  ``inline`` (in-memory) provider.

For each: **publish** N messages of about 600 bytes (a Protean event's
size) from one thread, then **consume with ack** all of them as a stream
subscription does: ``read_blocking(count=100)`` by one consumer of one
group, each message acknowledged (``ack``) one by one. For this provider
the consume time includes copying the log into the group (a group pulls
its messages, see docs/protean.md). Rates are messages per second.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import Progress, Server, fmt_num, median, render_table, rotated
from protean.domain import Domain
from protean.port.broker import BaseBroker, registry

#: (entry, backend of the comparison).
ENTRIES = (
    ("simplebroker (Redis)", "redis"),
    ("redis (Protean, Streams)", "redis"),
    ("simplebroker (SQLite)", "local"),
    ("inline (Protean)", "local"),
)

#: A message of about the size of a Protean event (data and metadata).
MESSAGE: dict[str, Any] = {
    "data": {"order_id": "0" * 36, "customer": "c" * 40, "total": 1234},
    "metadata": {
        "headers": {"id": "x" * 60, "type": "Shop.OrderPlaced.v1", "time": "2026-12-03T10:00:00"},
        "domain": {
            "stream_category": "shop::order",
            "kind": "EVENT",
            "version": 1,
            "pad": "p" * 300,
        },
    },
}

BATCH = 100


def plan_units(reps: int) -> int:
    """Return the progress units of the section."""
    return reps * len(ENTRIES)


def _broker(entry: str, url: str, sqlite_dir: Path) -> BaseBroker:
    info: dict[str, Any]
    if entry == "simplebroker (Redis)":
        info = {
            "provider": "simplebroker",
            "URI": url,
            "NAMESPACE": f"bench-{uuid.uuid4().hex[:8]}",
        }
    elif entry == "redis (Protean, Streams)":
        info = {"provider": "redis", "URI": url.rsplit("/", 1)[0] + "/3"}
    elif entry == "simplebroker (SQLite)":
        info = {"provider": "simplebroker", "URI": str(sqlite_dir / f"{uuid.uuid4().hex}.db")}
    else:
        info = {"provider": "inline"}
    domain = Domain(name="bench")
    domain.config["brokers"]["default"] = info
    return registry.get(info["provider"])("default", domain, info)


def _run(broker: BaseBroker, count: int) -> dict[str, float]:
    stream = f"bench::{uuid.uuid4().hex[:8]}"
    group = "bench.Handler"
    broker._ensure_group(group, stream)  # as a subscription does before it reads
    started = time.perf_counter()
    for _ in range(count):
        broker.publish(stream, MESSAGE)
    published = time.perf_counter() - started
    started = time.perf_counter()
    done = 0
    while done < count:
        for identifier, _ in broker.read_blocking(
            stream, group, "c1", timeout_ms=1000, count=BATCH
        ):
            if not broker.ack(stream, identifier, group):
                raise RuntimeError(f"ack of {identifier} refused")
            done += 1
    consumed = time.perf_counter() - started
    return {"publish_per_s": count / published, "consume_per_s": count / consumed}


def run_section(
    server: Server,
    *,
    reps: int,
    quick: bool,
    progress: Progress,
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run every entry ``reps`` times, interleaved; return medians."""
    count = 500 if quick else 3000
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in ENTRIES}
    with tempfile.TemporaryDirectory(prefix="bench-protean-") as temp:
        for rep in range(reps):
            for name, _ in rotated(list(ENTRIES), rep):
                progress.step(f"protean {name}")
                broker = _broker(name, server.url, Path(temp))
                try:
                    result = _run(broker, count)
                finally:
                    broker.close()
                samples[name].append(result)
                emit({"kind": "sample", "section": "protean", "entry": name, **result})
    return {
        "count": count,
        "entries": {
            name: {key: median(s[key] for s in rows) for key in ("publish_per_s", "consume_per_s")}
            for name, rows in samples.items()
        },
    }


def report(summary: dict[str, Any]) -> str:
    """Return the section's table."""
    rows = []
    entries = summary["entries"]
    for name, backend in ENTRIES:
        row = entries[name]
        rows.append([name, backend, fmt_num(row["publish_per_s"]), fmt_num(row["consume_per_s"])])
    table = render_table(["provider", "storage", "publish msg/s", "consume+ack msg/s"], rows, True)
    return f"Protean broker providers ({summary['count']} messages, median)\n\n{table}"
