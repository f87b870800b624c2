"""The verdict on a run's history, in the spirit of Jepsen's ``total-queue`` checker.

A task is *acknowledged* when its producer call returned success. Then:

- **lost**: acknowledged, but no run of it ever finished;
- **unexpected**: a run of a task nobody tried to send;
- **duplicated**: runs beyond the first, in total; at-least-once allows
  them only for messages that were in flight when a fault hit, so their
  number must not exceed the most messages held (reserved) on the server
  during any fault window (``bound``);
- **wrong**: the stored result is missing, not a success, or not the
  task's value; **stale**: it was written by another process than the one
  that started the task last (a worker whose lease had been taken over
  overwrote its successor's result);
- **late**: a worker cut off for longer than the lease (stopped or
  partitioned alone) started, after the heal, a task that another worker
  had started meanwhile: it ran a message whose lease had expired;
- **stuck**: a worker that ran tasks before the fault (of a victim fault:
  the victim) started none within ``stuck_after`` seconds of the heal,
  though work was waiting (a live, beating worker that takes nothing);
- **left**: messages still pending or reserved after the drain;
- **invariants**: the namespace breaks a storage invariant after the drain
  (``support.invariants``: a message in two states, an orphan token...);
- **producers**: a call that took longer than ``call_bound`` seconds; a
  task stored twice, or a successful call whose task was not stored; a
  call that failed although its task was stored, with an error that does
  not say the outcome is unknown (``misleading``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .history import Fault, History

#: Words with which an error may say that a write's outcome is unknown.
UNKNOWN_OUTCOME = re.compile(r"unknown|may have|might have|uncertain|not known", re.IGNORECASE)


@dataclass(frozen=True)
class Limits:
    """What a run may take: the lease, the stuck threshold, the producer's call bound."""

    lease: float
    stuck_after: float = 10.0
    call_bound: float = 30.0
    #: Slack around a fault window when counting messages in flight (sampling lag).
    slack: float = 1.0


@dataclass
class Verdict:
    """What the checker found; :meth:`problems` is empty when the run is clean."""

    tasks: int = 0
    done: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicates: int = 0
    bound: int = 0
    same_process: int = 0
    wrong: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    resumed: list[float | None] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    left: int = 0
    slow_calls: list[str] = field(default_factory=list)
    longest_call: float = 0.0
    stored_twice: list[str] = field(default_factory=list)
    not_stored: list[str] = field(default_factory=list)
    misleading: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    #: Why the run itself could not finish (a worker that never got ready...).
    broken: list[str] = field(default_factory=list)
    #: The storage invariant broken after the drain ("": none).
    invariants: str = ""

    def anomalies(self) -> dict[str, str]:
        """Return each kind of anomaly found (a short name) with one line about it."""
        found = [
            ("lost", self.lost, "lost"),
            ("unexpected", self.unexpected, "unexpected"),
            ("wrong", self.wrong, "wrong result"),
            ("stale", self.stale, "stale result"),
            ("late", self.late, "started after its lease expired"),
            ("stuck", self.stuck, "stuck"),
            ("slow-call", self.slow_calls, "producer call over its bound"),
            ("stored-twice", self.stored_twice, "stored twice"),
            ("not-stored", self.not_stored, "acknowledged but not stored"),
            ("misleading", self.misleading, "failed call was stored, error does not say unknown"),
        ]
        out = {"broken": f"run broken: {'; '.join(self.broken)}"} if self.broken else {}
        out |= {
            kind: f"{len(keys)} {what}: {sorted(keys)[:8]}" for kind, keys, what in found if keys
        }
        if self.duplicates > self.bound:
            out["duplicates"] = (
                f"{self.duplicates} duplicate runs, more than the {self.bound} in flight"
            )
        if self.left:
            out["left"] = f"{self.left} message(s) left pending or reserved after the drain"
        if self.invariants:
            out["invariants"] = f"storage invariants broken: {self.invariants}"
        return out

    def problems(self) -> list[str]:
        """Return one line per kind of anomaly found (empty: the run is clean)."""
        return list(self.anomalies().values())

    @property
    def ok(self) -> bool:
        """Return whether the run is clean."""
        return not self.problems()


def check(history: History, limits: Limits) -> Verdict:
    """Return the verdict on ``history`` (see the module docstring)."""
    verdict = Verdict(left=history.left, invariants=history.invariants)
    acknowledged = {key for key, send in history.sends.items() if send.ok}
    finished = {run.key for run in history.runs if run.end is not None}
    verdict.tasks, verdict.done = len(acknowledged), len(acknowledged & finished)
    verdict.lost = sorted(acknowledged - finished)
    verdict.unexpected = sorted({run.key for run in history.runs} - set(history.sends))
    _duplicates(history, limits, verdict)
    if history.results:
        _results(history, acknowledged & finished, verdict)
    for fault in history.faults:
        _late_starts(history, fault, limits, verdict)
        _progress(history, fault, acknowledged, limits, verdict)
    _producers(history, limits, verdict)
    return verdict


def _duplicates(history: History, limits: Limits, verdict: Verdict) -> None:
    starts = Counter(run.key for run in history.runs)
    verdict.duplicates = sum(count - 1 for count in starts.values())
    by_process = Counter((run.key, run.pid) for run in history.runs)
    verdict.same_process = sum(count - 1 for count in by_process.values())
    verdict.bound = max(
        (
            held
            for fault in history.faults
            for at, held in history.held
            if fault.start - limits.slack <= at <= fault.end + limits.lease + limits.slack
        ),
        default=0,
    )


def _results(history: History, keys: set[str], verdict: Verdict) -> None:
    for key in sorted(keys):
        result = history.results.get(key)
        if result is None or result.state != "SUCCESS" or not result.right:
            verdict.wrong.append(key)
            continue
        last = history.starts(key)[-1]
        if result.pid != last.pid:
            verdict.stale.append(key)


def _late_starts(history: History, fault: Fault, limits: Limits, verdict: Verdict) -> None:
    """Flag a victim's start after the heal of a task another worker started meanwhile."""
    if not fault.victims or fault.end - fault.start <= limits.lease:
        return
    for run in history.runs:
        if run.worker not in fault.victims or run.start < fault.end:
            continue
        taken_over = any(
            other.worker not in fault.victims and fault.start < other.start < run.start
            for other in history.starts(run.key)
        )
        if taken_over and run.key not in verdict.late:
            verdict.late.append(run.key)


def _progress(
    history: History, fault: Fault, acknowledged: set[str], limits: Limits, verdict: Verdict
) -> None:
    """Record when each worker started a task again after the heal; flag one that did not.

    The workers judged are those that ran tasks before the fault (of a victim
    fault: the victims), and only when at least two tasks each were waiting
    at the heal or sent after it (the run sends a burst right after the heal).
    """
    if fault.end == float("inf"):
        verdict.stuck.append(f"{fault.name}: never healed")
        return
    before = {run.worker for run in history.runs if run.start < fault.start}
    takers = sorted(before & fault.victims if fault.victims else before)
    finished = {run.key for run in history.runs if run.end is not None and run.end < fault.end}
    if len(acknowledged - finished) < 2 * len(takers):
        return  # too little work left to tell a stuck worker from an idle one
    for worker in takers:
        after = [r.start for r in history.runs if r.worker == worker and r.start >= fault.end]
        first = min(after) - fault.end if after else None
        verdict.resumed.append(first)
        if first is None or first > limits.stuck_after:
            verdict.stuck.append(
                f"{fault.name}: {worker} started nothing within {limits.stuck_after} s of the heal"
            )


def _producers(history: History, limits: Limits, verdict: Verdict) -> None:
    for key, send in history.sends.items():
        took = send.took
        if took is None or took > limits.call_bound:
            verdict.slow_calls.append(key)
        verdict.longest_call = max(verdict.longest_call, took or float("inf"))
        if not send.ok:
            verdict.errors[send.error[:120]] += 1
        copies = history.stored.get(key)
        if copies is None:
            continue
        if copies > 1:
            verdict.stored_twice.append(key)
        if send.ok and copies == 0:
            verdict.not_stored.append(key)
        if not send.ok and copies and not UNKNOWN_OUTCOME.search(send.error):
            verdict.misleading.append(key)
