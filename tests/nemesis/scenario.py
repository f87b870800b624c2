"""One run, start to verdict: workers, a paced producer, the fault, the drain, the check.

The producer sends a ``burst`` of tasks at once (a backlog: workers then
hold reservations and prefetched tasks when the fault strikes), then
``rate`` tasks a second with unique keys until ``cooldown`` seconds after
the heal, with another burst right after the heal (so that every worker
has work then: one that takes none is stuck); the fault strikes once
``warm`` tasks are done and the victim (or anyone) is running one. After
the heal everything is drained (every acknowledged task done, nothing
pending or reserved), up to ``drain_timeout``; then every stored result is
read and the history goes to the checker. A producer fault instead cuts
the producer off before any worker runs, counts what the server stored,
then starts the workers.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from support.invariants import check_invariants
from support.waiting import wait_for

from .checker import Limits, Verdict, check
from .faults import Fault
from .history import CLOCKS, read_history
from .rig import WORKERS, Rig
from .workloads import Producer, Workload


@dataclass
class Plan:
    """What one run does (durations in seconds)."""

    workload: Workload
    fault: Fault
    #: Lease seconds of every worker (0: the fault's own, else 2 s).
    lease: float = 0.0
    task_seconds: float = 0.2
    rate: float = 8.0
    burst: int = 20
    warm: int = 6
    cooldown: float = 2.0
    drain_timeout: float = 30.0
    stuck_after: float = 10.0
    #: The documented bound of a producer's call on a silent network: the
    #: 10 s command timeout (connection.COMMAND_TIMEOUT), plus 1 s for the
    #: client to raise and the framework to wrap the error (measured: 10.01 s).
    call_bound: float = 11.0

    def __post_init__(self) -> None:
        if not self.lease:
            self.lease = self.fault.lease or 2.0

    @property
    def limits(self) -> Limits:
        """Return the checker's limits for this plan."""
        return Limits(self.lease, self.stuck_after, self.call_bound)


@dataclass
class Outcome:
    """A run's verdict and what it cost."""

    plan: Plan
    folder: Path
    verdict: Verdict
    seconds: float
    load: tuple[float, float]
    notes: list[str] = field(default_factory=list)


def error_text(exc: BaseException) -> str:
    """Return ``Type: message <- Cause: message ...`` on one line (the log's format)."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts).replace("\n", " ")[:400]


class Sender:
    """Sends ``burst`` tasks, then ``rate`` a second, from a thread; logs each call's outcome."""

    def __init__(self, rig: Rig, producer: Producer, rate: float, burst: int = 0) -> None:
        self.rig, self.producer, self.rate, self.burst = rig, producer, rate, burst
        self.prefix = f"k{uuid.uuid4().hex[:6]}"
        self.keys: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nemesis-sender")

    def start(self) -> Sender:
        """Start sending."""
        self._thread.start()
        return self

    def rush(self, count: int) -> None:
        """Send ``count`` tasks at once, then carry on at the rate."""
        self.burst += count

    def stop(self, timeout: float) -> None:
        """Stop sending; wait up to ``timeout`` for a call still blocked (then leave it)."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        began = time.monotonic()
        try:
            while not self._stop.is_set():
                key = f"{self.prefix}-{len(self.keys):05d}"
                self.keys.append(key)
                self.rig.note("send", key)
                try:
                    self.rig.note("sent", key, self.producer.send(key))
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    self.rig.note("unsent", key, error_text(exc))
                # Paced: the next call is due at its slot, however long this one took.
                due = began + max(0, len(self.keys) - self.burst) / self.rate
                self._stop.wait(max(0.0, due - time.monotonic()))
        finally:
            self.producer.close()


def run(plan: Plan, folder: Path) -> Outcome:
    """Run ``plan`` with its logs in ``folder``; return the verdict.

    A folder left by an earlier run is emptied first: the logs are
    append-only, and the checker must read this run's history alone.
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    clocks = {name: plan.fault.clock(name) for name in WORKERS if plan.fault.clock(name)}
    (folder / CLOCKS).write_text(json.dumps(clocks))
    notes: list[str] = []
    with Rig(plan, folder) as rig:
        stop = threading.Event()
        rig.sample_held(stop)
        try:
            if plan.fault.producer_fault:
                _producer_phase(rig)
            else:
                _worker_phase(rig)
            notes += _drain(rig)
            _read_results(rig)
            rig.note("left", rig.left())
            _check_invariants(rig)
        finally:
            stop.set()
    history = read_history(folder, fanout=plan.workload.fanout)
    verdict = check(history, plan.limits)
    seconds = time.monotonic() - started
    return Outcome(plan, folder, verdict, seconds, (load, os.getloadavg()[0]), notes)


def _strike(rig: Rig) -> None:
    """Inject the fault, hold it, heal it; log its window."""
    fault = rig.plan.fault
    if not fault.windowed:
        time.sleep(rig.plan.lease * 2)  # a fault without a window: run on as long as one
        return
    rig.note("fault", fault.name, ",".join(sorted(fault.victims())) or "-")
    fault.inject(rig)
    try:
        fault.hold(rig)
    finally:
        fault.heal(rig)
        rig.note("heal", fault.name)
    fault.settle(rig)
    rig.note("settled", fault.name)


def _done(rig: Rig) -> int:
    return sum(1 for run in read_history(rig.folder).runs if run.end is not None)


def _worker_phase(rig: Rig) -> None:
    plan = rig.plan
    rig.start_workers()
    producer = plan.workload.producer(rig.setup, rig.url_for("producer"))
    sender = Sender(rig, producer, plan.rate, plan.burst).start()
    try:
        wait_for(
            lambda: _done(rig) >= plan.warm and plan.fault.ready(rig),
            60,
            "tasks done and a worker busy",
            interval=0.02,
        )
        _strike(rig)
        sender.rush(plan.burst)  # work for every worker at once: a stuck one shows
        time.sleep(plan.cooldown)  # tasks keep coming after the heal
    finally:
        sender.stop(plan.call_bound + 10)


def _producer_phase(rig: Rig) -> None:
    plan = rig.plan
    sender = Sender(rig, plan.workload.producer(rig.setup, rig.url_for("producer")), plan.rate)
    sender.start()
    sent = lambda: read_history(rig.folder).sends  # noqa: E731 - a view for the waits below
    try:
        wait_for(lambda: any(s.ok for s in sent().values()), 60, "a first task stored")
        _strike(rig)
        settled = len(sent())
        wait_for(lambda: sum(s.ok for s in sent().values()) >= settled + 2, 60, "sends again")
    finally:
        sender.stop(plan.call_bound + 10)
    copies = rig.stored(sender.keys)
    per_send = max(1, copies[sender.keys[0]])  # the first key was stored before the fault
    for key in sender.keys:
        rig.note("stored", key, copies[key] // per_send)
    rig.start_workers()


def _drain(rig: Rig) -> list[str]:
    """Wait until every acknowledged task is done and nothing is left; say so if not."""
    fanout = rig.plan.workload.fanout

    def drained() -> bool:
        history = read_history(rig.folder, fanout=fanout)
        done = {run.key for run in history.runs if run.end is not None}
        acknowledged = {key for key, send in history.sends.items() if send.ok}
        return acknowledged <= done and rig.left() == 0

    try:
        wait_for(drained, rig.plan.drain_timeout, "the drain", interval=0.2)
    except AssertionError as exc:
        return [str(exc)]
    return []


def _check_invariants(rig: Rig) -> None:
    """Log the first storage invariant the namespace breaks, if any."""
    try:
        check_invariants(rig.admin, rig.setup.namespace)
    except AssertionError as exc:
        rig.note("invariants", str(exc).replace("\n", " ")[:300])


def _read_results(rig: Rig) -> None:
    workload = rig.plan.workload
    if not workload.results:
        return
    history = read_history(rig.folder)
    refs = {key: send.ref for key, send in history.sends.items() if send.ok}
    for key, result in workload.read_results(rig.setup, refs).items():
        rig.note("result", key, result.state, result.pid or "-", int(result.right))
