"""What a run logged, read back: sends, task runs, results, faults, samples of held messages.

A run's folder holds one append-only log per worker process group
(``<worker>.log``, lines of :mod:`support.eventlog`: ``start <key>`` and
``done <key>`` from the worker apps' tasks, stamped with the time and the
pid of the process that ran them) and the harness's own ``nemesis.log``:

- ``send <key>``, then ``sent <key> <ref>`` or ``unsent <key> <error...>``:
  one producer call (``ref``: the framework's task id, to read its result);
- ``fault <name> <victims>`` and ``heal <name>``: a fault's window
  (``victims``: comma-separated worker names cut off, ``-``: every client);
- ``held <n>``: messages reserved on the server at that moment (sampled);
- ``stored <key> <copies>``: copies of a task the server held before any
  worker ran (producer faults);
- ``result <key> <state> <pid> <right>``: the stored result (``pid``: the
  process that wrote it, ``right``: 1 when its value is the task's);
- ``left <n>``: messages still pending or reserved after the drain;
- ``invariants <problem...>``: the storage invariants the namespace broke
  after the drain (``support.invariants``; nothing logged: none).

A worker whose clock was shifted (the clock fault) logs shifted times; the
offsets in ``clocks.json`` (seconds, by worker name) are taken off again.
Protean's handlers log JSON lines instead; :func:`read_protean` reads them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from support.eventlog import Event, read_events

#: The harness's log in a run's folder; every other ``*.log`` is a worker's.
HARNESS = "nemesis.log"
#: Clock offsets of shifted workers (seconds, by worker name).
CLOCKS = "clocks.json"


@dataclass(frozen=True)
class Send:
    """One producer call: when it began, how long it took, and how it ended."""

    key: str
    at: float
    took: float | None  #: None: it never returned
    ok: bool
    ref: str = ""
    error: str = ""


@dataclass(frozen=True)
class Run:
    """One execution of a task's body: who ran it, when it started and ended."""

    key: str
    worker: str
    pid: int
    start: float
    end: float | None = None


@dataclass(frozen=True)
class Result:
    """The result stored for a task, as a client reads it after the drain."""

    state: str
    pid: int | None
    right: bool


@dataclass(frozen=True)
class Fault:
    """A fault's window; ``victims`` empty: it cut off every client."""

    name: str
    start: float
    end: float
    victims: frozenset[str] = frozenset()


@dataclass
class History:
    """Everything a run logged (see the module docstring)."""

    sends: dict[str, Send] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    results: dict[str, Result] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    held: list[tuple[float, int]] = field(default_factory=list)
    stored: dict[str, int] = field(default_factory=dict)
    left: int = 0
    invariants: str = ""

    def starts(self, key: str) -> list[Run]:
        """Return the runs of ``key``, oldest start first."""
        return sorted((run for run in self.runs if run.key == key), key=lambda r: r.start)


def pair_runs(events: Iterable[tuple[str, str, int, float, str]]) -> list[Run]:
    """Return runs from (kind, key, pid, at, worker) events: each done ends its pid's last start."""
    open_runs: dict[tuple[str, int], list[Run]] = defaultdict(list)
    runs: list[Run] = []
    for kind, key, pid, at, worker in sorted(events, key=lambda e: e[3]):
        if kind == "start":
            open_runs[(key, pid)].append(Run(key, worker, pid, at))
        elif kind == "done" and open_runs[(key, pid)]:
            started = open_runs[(key, pid)].pop()
            runs.append(Run(key, worker, pid, started.start, at))
    runs.extend(run for pending in open_runs.values() for run in pending)
    return sorted(runs, key=lambda r: r.start)


def read_history(folder: Path, *, fanout: tuple[str, ...] = ()) -> History:
    """Read a run's folder; with ``fanout``, a send stands for task ``<f>:<key>`` of each f."""
    history = History()
    _read_harness(history, read_events(folder / HARNESS), fanout)
    clocks = json.loads((folder / CLOCKS).read_text()) if (folder / CLOCKS).exists() else {}
    task_events = []
    for log in sorted(folder.glob("*.log")):
        if log.name == HARNESS:
            continue
        worker, offset = log.stem, float(clocks.get(log.stem, 0.0))
        for event in read_events(log):
            if event.kind in ("start", "done") and event.words:
                task_events.append(
                    (event.kind, event.words[0], event.pid, event.at - offset, worker)
                )
    for log in sorted(folder.glob("*.jsonl")):
        task_events.extend(read_protean(log))
    history.runs = pair_runs(task_events)
    return history


def read_protean(log: Path) -> list[tuple[str, str, int, float, str]]:
    """Return the task events of papp.py's handler log (``{"h", "id", "pid", "what", "at"}``)."""
    out = []
    for line in log.read_text().splitlines():
        if line:
            call = json.loads(line)
            out.append(
                (call["what"], f"{call['h']}:{call['id']}", call["pid"], call["at"], log.stem)
            )
    return out


def _read_harness(history: History, events: list[Event], fanout: tuple[str, ...]) -> None:
    began: dict[str, float] = {}
    opened: dict[str, tuple[float, frozenset[str]]] = {}
    for event in events:
        kind, words = event.kind, event.words
        if kind == "send":
            began[words[0]] = event.at
        elif kind in ("sent", "unsent"):
            ok = kind == "sent"
            for key in _tasks(words[0], fanout):
                history.sends[key] = Send(
                    key,
                    began[words[0]],
                    event.at - began[words[0]],
                    ok,
                    ref=words[1] if ok and len(words) > 1 else "",
                    error="" if ok else " ".join(words[1:]),
                )
        elif kind == "fault":
            victims = frozenset() if words[1] == "-" else frozenset(words[1].split(","))
            opened[words[0]] = (event.at, victims)
        elif kind == "heal":
            start, victims = opened.pop(words[0])
            history.faults.append(Fault(words[0], start, event.at, victims))
        else:
            _read_fact(history, kind, words, event.at, fanout)
    for key, at in began.items():  # a call that never returned (still blocked at the end)
        for task in _tasks(key, fanout):
            history.sends.setdefault(task, Send(task, at, None, ok=False, error="never returned"))
    for name, (start, victims) in opened.items():  # never healed: open until the end
        history.faults.append(Fault(name, start, float("inf"), victims))


def _read_fact(
    history: History, kind: str, words: tuple[str, ...], at: float, fanout: tuple[str, ...]
) -> None:
    if kind == "held":
        history.held.append((at, int(words[0])))
    elif kind == "stored":
        for task in _tasks(words[0], fanout):
            history.stored[task] = int(words[1])
    elif kind == "result":
        pid = None if words[2] == "-" else int(words[2])
        history.results[words[0]] = Result(words[1], pid, words[3] == "1")
    elif kind == "left":
        history.left = int(words[0])
    elif kind == "invariants":
        history.invariants = " ".join(words)


def _tasks(key: str, fanout: tuple[str, ...]) -> list[str]:
    return [f"{name}:{key}" for name in fanout] if fanout else [key]
