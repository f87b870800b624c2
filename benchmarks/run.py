"""Run the benchmarks: ``python benchmarks/run.py [--quick] [--only SECTION] ...``.

Sections: ``backend`` (parts ``ops``, ``leases``, ``keep_newest``, ``watcher``,
``multiprocess``), ``taskiq``, ``celery``, ``topology`` (cluster client vs
single server, Taskiq shards on a 3-primary cluster), ``operations`` (what
the script counters, the task index and the task statistics cost per
operation or task, a scrape of 10,000 queues) and
``protean`` (the Protean provider vs Protean's redis and inline providers).
``--only`` takes a comma-separated list of sections or backend parts. Each
section gets its own throwaway server.

Output: tables on stdout, a progress bar on stderr, every sample and summary
as JSON lines (``benchmarks/results/bench-<time>.jsonl`` or ``--json``), a
PNG chart (``--chart``), ``benchmarks/results/latest.json``, and with
``--write-doc`` the results block of ``docs/benchmarks.md`` (or later, from a saved
summary, with ``--doc-from benchmarks/results/latest.json``).
Benchmarks never gate CI.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import backend
import celery_bench
import ops_bench
import protean_bench
import report
import taskiq_bench
import topology_bench
from common import RESULTS_DIR, JsonLines, Progress, Server, environment

SECTIONS = ("backend", "taskiq", "celery", "topology", "operations", "protean")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated sections (backend, taskiq, celery, topology, operations, "
        f"protean) or backend parts ({', '.join(backend.BACKEND_PARTS)})",
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 3)")
    parser.add_argument("--json", type=Path, help="JSON-lines output path")
    parser.add_argument("--chart", type=Path, help="PNG chart path")
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument(
        "--doc-from",
        type=Path,
        metavar="JSON",
        help="run nothing; rewrite docs/benchmarks.md from a saved summary "
        "(benchmarks/results/latest.json, or a run's .jsonl)",
    )
    args = parser.parse_args(argv)
    if args.reps < 3:
        parser.error("--reps must be at least 3: every figure is a median of >= 3 reps")
    return args


def selection(only: str) -> tuple[bool, set[str], bool, bool]:
    """Return (run backend, backend parts, run taskiq, run celery)."""
    names = {s.strip() for s in only.split(",") if s.strip()}
    unknown = names - set(SECTIONS) - set(backend.BACKEND_PARTS)
    if unknown:
        raise SystemExit(f"unknown --only value(s): {', '.join(sorted(unknown))}")
    if not names:
        return True, set(backend.BACKEND_PARTS), True, True
    parts = names & set(backend.BACKEND_PARTS)
    if "backend" in names:
        parts = set(backend.BACKEND_PARTS)
    return bool(parts), parts, "taskiq" in names, "celery" in names


def load_summary(path: Path) -> dict[str, Any]:
    """Load a saved summary: ``latest.json``, or the summary line of a JSON-lines file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return dict(json.loads(text))
    for line in reversed(text.splitlines()):
        record = json.loads(line)
        if record.get("kind") == "summary":
            return {k: v for k, v in record.items() if k != "kind"}
    raise SystemExit(f"{path} holds no summary record")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.doc_from:
        report.write_doc(load_summary(args.doc_from))
        print(f"updated {report.DOC} from {args.doc_from}")
        return 0
    run_backend, parts, run_taskiq, run_celery = selection(args.only)
    names = {s.strip() for s in args.only.split(",") if s.strip()}
    run_topology = not names or "topology" in names
    run_operations = not names or "operations" in names
    run_protean = not names or "protean" in names
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.json or RESULTS_DIR / f"bench-{stamp}.jsonl"
    chart_path = args.chart or RESULTS_DIR / f"bench-{stamp}.png"
    sink = JsonLines(json_path)
    env = environment()  # at the start: the load average is the machine's, not ours
    started = time.monotonic()
    summary: dict[str, Any] = {
        "command": " ".join(
            ["benchmarks/run.py", shlex.join(argv if argv is not None else sys.argv[1:])]
        ).strip(),
        "quick": args.quick,
        "reps": args.reps,
    }
    server_version = None
    try:
        if run_backend:
            units = backend.plan_units(args.reps, parts)
            progress = Progress(units, "backend")
            with Server() as server:
                server_version = server.version()
                summary["backend"] = backend.run_section(
                    server,
                    reps=args.reps,
                    quick=args.quick,
                    progress=progress,
                    emit=sink.write,
                    parts=parts,
                )
            progress.finish()
            print(backend.report(summary["backend"]), end="\n\n", flush=True)
        if run_taskiq:
            progress = Progress(taskiq_bench.plan_units(args.reps), "taskiq")
            with Server() as server:
                server_version = server_version or server.version()
                summary["taskiq"] = taskiq_bench.run_section(
                    server, reps=args.reps, quick=args.quick, progress=progress, emit=sink.write
                )
            progress.finish()
            print(taskiq_bench.report(summary["taskiq"]), end="\n\n", flush=True)
        if run_celery:
            progress = Progress(celery_bench.plan_units(args.reps), "celery")
            with Server() as server:
                server_version = server_version or server.version()
                summary["celery"] = celery_bench.run_section(
                    server, reps=args.reps, quick=args.quick, progress=progress, emit=sink.write
                )
            progress.finish()
            print(celery_bench.report(summary["celery"]), end="\n\n", flush=True)
        if run_topology:
            progress = Progress(topology_bench.plan_units(args.reps), "topology")
            summary["topology"] = topology_bench.run_section(
                reps=args.reps, quick=args.quick, progress=progress, emit=sink.write
            )
            progress.finish()
            print(topology_bench.report(summary["topology"]), end="\n\n", flush=True)
        if run_operations:
            progress = Progress(ops_bench.plan_units(args.reps), "operations")
            with Server() as server:
                summary["operations"] = ops_bench.run_section(
                    server, reps=args.reps, quick=args.quick, progress=progress, emit=sink.write
                )
            progress.finish()
            print(ops_bench.report(summary["operations"]), end="\n\n", flush=True)
        if run_protean:
            progress = Progress(protean_bench.plan_units(args.reps), "protean")
            with Server() as server:
                server_version = server_version or server.version()
                summary["protean"] = protean_bench.run_section(
                    server, reps=args.reps, quick=args.quick, progress=progress, emit=sink.write
                )
            progress.finish()
            print(protean_bench.report(summary["protean"]), end="\n\n", flush=True)
    finally:
        summary["elapsed_s"] = time.monotonic() - started
        summary["environment"] = {**env, "server": server_version or "unknown"}
        budgets = report.budgets(summary)
        for row in budgets:
            sink.write({"kind": "budget", **row})
        sink.write({"kind": "summary", **summary})
        sink.close()
    print("Budgets\n\n" + report.budget_table(budgets), flush=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "latest.json").write_text(
        json.dumps(summary, indent=1, default=str), encoding="utf-8"
    )
    print(f"\nJSON lines: {json_path}")
    outcome = report.chart(summary, chart_path)
    print(f"chart: {chart_path}" if outcome == "written" else f"chart: {outcome}")
    if args.write_doc:
        report.write_doc(summary)
        print(f"updated {report.DOC}")
    print(f"elapsed: {summary['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
