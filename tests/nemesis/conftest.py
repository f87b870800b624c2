"""The short nemesis run inside ``make test``: ``nemesis(workload, fault)`` runs one case.

Every run starts its own servers, proxies and workers (nothing shared with
the session's fixtures) and keeps its logs in the test's ``tmp_path``
(pytest keeps the last three sessions' folders). Any anomaly fails the
case, with the checker's report and where the logs are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .faults import FAULTS
from .frameworks import WORKLOADS
from .scenario import Outcome, Plan, run


def report(outcome: Outcome) -> str:
    """Return what a failed case shows: the anomalies, the notes, where the logs are."""
    lines = [*outcome.verdict.problems(), *outcome.notes, f"logs: {outcome.folder}"]
    v = outcome.verdict
    lines.append(
        f"{v.done}/{v.tasks} done, {v.duplicates} duplicates (bound {v.bound}), "
        f"resumed {v.resumed}, longest producer call {v.longest_call:.1f} s, "
        f"{outcome.seconds:.0f} s, load {outcome.load[0]:.1f}->{outcome.load[1]:.1f}"
    )
    return "\n".join(lines)


@pytest.fixture
def nemesis(tmp_path: Path) -> Callable[..., Outcome]:
    """Run ``workload`` under ``fault`` once; fail on any anomaly (see the module docstring)."""

    def run_case(workload: str, fault: str) -> Outcome:
        outcome = run(Plan(WORKLOADS[workload], FAULTS[fault]), tmp_path / "run")
        assert not outcome.verdict.anomalies(), report(outcome)
        return outcome

    return run_case
