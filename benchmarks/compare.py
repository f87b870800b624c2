"""Compare two benchmark runs: ``python benchmarks/compare.py BEFORE.json AFTER.json``.

Each argument is a run summary (``benchmarks/results/latest.json`` as a run
leaves it; copy it aside between runs). Prints, for every rate both runs
measured, the two figures and after/before as a Markdown table: the
backend's operations and reservations (ours, not the raw or SQLite
references), the QueueWatcher latency, and the Taskiq rows. Used to show
that a refactoring cost nothing (docs/benchmarks.md); it never gates CI.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: (section, label, value, higher is better)
Row = tuple[str, str, float, bool]


def rows(summary: dict[str, Any]) -> Iterator[Row]:
    """Yield every comparable figure of one run summary."""
    backend = summary.get("backend", {})
    for op in backend.get("ops", {}).values():
        ours = op.get("median", {}).get("redis") or {}
        field = "ops_per_s" if op.get("msgs", 1) == 1 else "msgs_per_s"
        if ours.get(field) is not None:
            unit = "ops/s" if field == "ops_per_s" else "msgs/s"
            yield "backend", f"{op['label']} ({unit})", float(ours[field]), True
    for key, lease in backend.get("leases", {}).items():
        value = lease.get("median", {}).get("ops_per_s")
        if value is not None:
            yield "leases", f"{lease.get('label', key)} (ops/s)", float(value), True
    watcher = backend.get("watcher", {}).get("redis", {})
    for pct in ("p50", "p99"):
        if watcher.get(f"{pct}_ms") is not None:
            label = f"QueueWatcher write-to-handler {pct} (ms)"
            yield "watcher", label, float(watcher[f"{pct}_ms"]), False
    for name, row in summary.get("taskiq", {}).get("rows", {}).items():
        if row.get("e2e_per_s") is not None:
            yield "taskiq", f"{name}: end to end (tasks/s)", float(row["e2e_per_s"]), True
        if row.get("worker_cpu_ms_per_task") is not None:
            label = f"{name}: worker CPU (ms/task)"
            yield "taskiq", label, float(row["worker_cpu_ms_per_task"]), False


def fmt(value: float) -> str:
    """Return ``value`` with thousands separators, or three significant digits when small."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Return the Markdown table of the figures both runs have."""
    old = {(section, label): value for section, label, value, _ in rows(before)}
    lines = [
        "| section | figure | before | after | after/before |",
        "|---|---|---:|---:|---:|",
    ]
    for section, label, value, higher_better in rows(after):
        previous = old.get((section, label))
        if previous is None or not previous:
            continue
        ratio = value / previous
        mark = "" if (ratio >= 1) == higher_better or abs(ratio - 1) < 0.005 else " (worse)"
        lines.append(
            f"| {section} | {label} | {fmt(previous)} | {fmt(value)} | {ratio:.2f}{mark} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    print(table(before, after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
