"""The short nemesis run inside ``make test``: ``nemesis(workload, fault)`` runs one case.

Every run starts its own servers, proxies and workers (nothing shared with
the session's fixtures) and keeps its logs in the test's ``tmp_path``
(pytest keeps the last three sessions' folders). A case whose anomaly is an
open bug of issue 42 passes ``known``: the kinds of anomaly that bug
causes. The test then raises :class:`KnownAnomaly` when it finds those and
nothing else (mark it ``xfail(strict=True, raises=KnownAnomaly)``): any
other anomaly still fails it, and so does a clean run, which is the sign
to flip the case once the fix has landed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from .faults import FAULTS
from .frameworks import WORKLOADS
from .scenario import Outcome, Plan, run


class KnownAnomaly(AssertionError):
    """The run found what an open bug of issue 42 causes, and nothing else."""


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

    def run_case(workload: str, fault: str, known: Iterable[str] = ()) -> Outcome:
        outcome = run(Plan(WORKLOADS[workload], FAULTS[fault]), tmp_path / "run")
        found = set(outcome.verdict.anomalies())
        if found and known and found <= set(known):
            raise KnownAnomaly(report(outcome))
        assert not found, report(outcome)
        return outcome

    return run_case
