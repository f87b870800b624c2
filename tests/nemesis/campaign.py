"""``make nemesis``: every fault x every workload x N runs, and a markdown summary.

Run from the repository root::

    PYTHONPATH=tests .venv/bin/python -m nemesis.campaign --runs 3 --out .nemesis/summary.md

``--faults`` and ``--workloads`` take comma-separated names (``--list``
shows them). Each run's logs stay in ``<out dir>/runs/<fault>/<workload>-<n>/``
(the harness's ``nemesis.log``, each worker's log and output); the summary
has one table of verdicts per fault and framework, then a row per run.
Runs go one after the other: they measure timing, so they must not
compete for the CPU with each other (note the load average in the table).
"""

from __future__ import annotations

import argparse
import difflib
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from simplebroker_redis.devserver import server_binary

from .checker import Verdict
from .faults import FAULTS, ClockSkew
from .frameworks import WORKLOADS
from .scenario import Outcome, Plan, run


def cell(outcomes: list[Outcome]) -> str:
    """Return one table cell: clean runs of all, and the worst of each anomaly."""
    clean = sum(o.verdict.ok for o in outcomes)
    worst: dict[str, int] = {}
    for outcome in outcomes:
        for line in outcome.verdict.problems():
            count, _, what = line.partition(" ")
            what = what.split(":")[0].split(", more")[0]
            worst[what] = max(worst.get(what, 0), int(count) if count.isdigit() else 1)
    duplicates = max(o.verdict.duplicates for o in outcomes)
    text = f"{clean}/{len(outcomes)} clean, dup ≤ {duplicates}"
    if worst:
        text += "; " + "; ".join(f"**{what} {n}**" for what, n in sorted(worst.items()))
    return text


def detail(outcome: Outcome, number: int) -> str:
    """Return one row of the per-run table."""
    v = outcome.verdict
    resumed = [f"{r:.1f}" if r is not None else "never" for r in v.resumed]
    errors = "; ".join(f"{n}× {text[:70]}" for text, n in v.errors.most_common(2))
    cells = [
        outcome.plan.fault.name,
        outcome.plan.workload.name,
        str(number),
        "clean" if v.ok else "<br>".join(v.problems()),
        f"{v.done}/{v.tasks}",
        f"{v.duplicates} (≤ {v.bound}; same process {v.same_process})",
        ", ".join(resumed) or "-",
        f"{v.longest_call:.1f}",
        errors or "-",
        f"{outcome.seconds:.0f} s, load {outcome.load[0]:.1f}→{outcome.load[1]:.1f}",
    ]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def commit() -> str:
    """Return the checkout's commit, marked ``+changes`` when files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def summary(results: dict[tuple[str, str], list[Outcome]], runs: int, head: str) -> str:
    """Return the markdown summary of a campaign run on commit ``head``."""
    workloads = sorted({w for _, w in results}, key=list(WORKLOADS).index)
    binary = subprocess.run([server_binary(), "--version"], capture_output=True, text=True).stdout
    lines = [
        f"# Nemesis: {runs} run(s) of each fault and workload",
        "",
        f"Commit {head}, {platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}; server: {binary.strip()[:80]}; "
        f"clocks shifted with {ClockSkew().how}.",
        "",
        "| fault | " + " | ".join(workloads) + " |",
        "|---|" + "---|" * len(workloads),
    ]
    for fault in dict.fromkeys(f for f, _ in results):
        cells = [cell(results[(fault, w)]) if (fault, w) in results else "-" for w in workloads]
        lines.append(f"| {fault} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| fault | workload | run | verdict | done | duplicates | resumed after heal (s) "
        "| longest producer call (s) | producer errors | time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for outcomes in results.values():
        lines += [detail(outcome, n) for n, outcome in enumerate(outcomes, 1)]
    return "\n".join(lines) + "\n"


def _positive(text: str) -> int:
    """Return ``text`` as a count of runs (argparse's type: a clear error otherwise)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs (1 or more)")
    return int(text)


def _names(known: Mapping[str, object], kind: str) -> Callable[[str], list[str]]:
    """Return argparse's type for a comma-separated list of ``known`` names."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        for name in names:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise argparse.ArgumentTypeError(f"no {kind} {name!r}{hint}; --list shows them all")
        if not names:
            raise argparse.ArgumentTypeError(f"no {kind} named")
        return names

    return parse


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; exit 1 if any run found an anomaly."""
    parser = argparse.ArgumentParser(prog="python -m nemesis.campaign", description=__doc__)
    parser.add_argument("--runs", type=_positive, default=3)
    parser.add_argument("--faults", type=_names(FAULTS, "fault"), default=",".join(FAULTS))
    parser.add_argument(
        "--workloads", type=_names(WORKLOADS, "workload"), default=",".join(WORKLOADS)
    )
    parser.add_argument("--out", type=Path, default=Path(".nemesis/summary.md"))
    parser.add_argument("--list", action="store_true", help="list faults and workloads")
    args = parser.parse_args(argv)
    if args.list:
        print("faults:", ", ".join(FAULTS), "\nworkloads:", ", ".join(WORKLOADS))
        return 0
    # Absolute: Protean's and Dramatiq's workers run in their own folders and log into it.
    folder = args.out.resolve().parent / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    head = commit()  # now: the code these runs load, whatever the checkout becomes meanwhile
    results: dict[tuple[str, str], list[Outcome]] = {}
    for fault_name in args.faults:
        for workload_name in args.workloads:
            for n in range(1, args.runs + 1):
                # The strike waits for 4, 6, 8... tasks done: each run hits the
                # victim at another point of its batch or prefetch window.
                plan = Plan(WORKLOADS[workload_name], FAULTS[fault_name], warm=2 + 2 * n)
                where = folder / fault_name / f"{workload_name}-{n}"
                try:
                    outcome = run(plan, where)
                except Exception as exc:  # noqa: BLE001 - one broken run must not end the rest
                    outcome = Outcome(plan, where, Verdict(broken=[repr(exc)[:300]]), 0.0, (0, 0))
                results.setdefault((fault_name, workload_name), []).append(outcome)
                verdict = "clean" if outcome.verdict.ok else "; ".join(outcome.verdict.problems())
                print(f"{fault_name} {workload_name} #{n}: {verdict} ({outcome.seconds:.0f} s)",
                      flush=True)  # fmt: skip
                args.out.write_text(summary(results, args.runs, head))
    rows = {f"{f} {w}": [o.verdict.problems() for o in runs] for (f, w), runs in results.items()}
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(f"summary: {args.out}")
    return 0 if all(o.verdict.ok for runs in results.values() for o in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
