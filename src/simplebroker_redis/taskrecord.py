"""Task records: what was counted about one task name, and its execution-time histogram.

The server keeps one record per task name and minute (and one since the
namespace began) as text that ``lua/lib/taskstats.lua`` only adds up:
``"<enqueued>,<done>,<failed>,<retried>,<sum µs>;<first bucket>:<count>,<count>,..."``
(one count per bucket from the first that holds a run, '' for none).
Execution times go into logarithmic buckets, four per doubling: bucket
``b`` holds runs of at most ``100 µs x 2**(b/4)`` (the first, every run up
to 100 µs). A percentile read from them is the upper bound of the bucket
it falls in: at most 19 % above the true value, whatever the spread of
times, in a record of a fixed, small size (96 buckets reach 14 days).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

#: Upper bound of bucket 0, in seconds.
BASE_SECONDS: Final[float] = 1e-4

#: Buckets per doubling of the execution time.
PER_DOUBLING: Final[int] = 4

#: The last bucket (runs longer than its lower bound all go there).
LAST_BUCKET: Final[int] = 95

#: The events counted per task name.
EVENTS: Final[tuple[str, ...]] = ("enqueued", "done", "failed", "retried")


def bucket_of(seconds: float) -> int:
    """Return the histogram bucket of a run of ``seconds``."""
    if not seconds > BASE_SECONDS:  # also NaN
        return 0
    return min(LAST_BUCKET, math.ceil(math.log2(seconds / BASE_SECONDS) * PER_DOUBLING - 1e-9))


def bucket_upper(bucket: int) -> float:
    """Return the longest run (seconds) bucket ``bucket`` holds."""
    return BASE_SECONDS * 2 ** (bucket / PER_DOUBLING)


@dataclass(slots=True)
class TaskRecord:
    """Counts and execution times of one task name (one minute, or all time)."""

    enqueued: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    sum_us: int = 0  #: execution times of the runs counted, added up
    hist: dict[int, int] = field(default_factory=dict)  #: bucket -> runs

    @classmethod
    def parse(cls, text: str | bytes) -> TaskRecord:
        """Read a record as the server stores it (damaged parts count as 0)."""
        if isinstance(text, bytes):
            text = text.decode()
        head, _, hist = text.partition(";")
        numbers = [_int(value) for value in head.split(",")[:5]]
        numbers += [0] * (5 - len(numbers))
        enqueued, done, failed, retried, sum_us = numbers
        record = cls(enqueued, done, failed, retried, sum_us)
        first, _, counts = hist.partition(":")
        if first.isdigit():
            for offset, count in enumerate(counts.split(",")):
                if count.isdigit() and int(count):
                    record.hist[int(first) + offset] = int(count)
        return record

    def encode(self) -> str:
        """Return the record as the server stores it."""
        head = f"{self.enqueued},{self.done},{self.failed},{self.retried},{self.sum_us};"
        return head + self.histogram_text()

    def histogram_text(self) -> str:
        """Return the histogram part only (``"<first bucket>:<count>,<count>,..."``)."""
        used = [bucket for bucket, count in self.hist.items() if count]
        if not used:
            return ""
        first, last = min(used), max(used)
        counts = (str(self.hist.get(b, 0) or "") for b in range(first, last + 1))
        return f"{first}:" + ",".join(counts)

    def add(self, other: TaskRecord) -> None:
        """Add ``other``'s counts and runs to this record."""
        self.enqueued += other.enqueued
        self.done += other.done
        self.failed += other.failed
        self.retried += other.retried
        self.sum_us += other.sum_us
        for bucket, count in other.hist.items():
            self.hist[bucket] = self.hist.get(bucket, 0) + count

    def run(self, seconds: float) -> None:
        """Count one run's execution time."""
        bucket = bucket_of(seconds)
        self.hist[bucket] = self.hist.get(bucket, 0) + 1
        self.sum_us += max(0, round(seconds * 1_000_000))

    @property
    def runs(self) -> int:
        """Return how many execution times the record holds."""
        return sum(self.hist.values())

    def percentile(self, q: float) -> float | None:
        """Return the ``q`` quantile (0-1) of the execution times, seconds; None without runs."""
        return percentile(self.hist, q)

    def count(self, event: str) -> int:
        """Return the counter of ``event`` (one of :data:`EVENTS`)."""
        return int(getattr(self, event))


def percentile(hist: Mapping[int, int], q: float) -> float | None:
    """Return the ``q`` quantile of a histogram (the upper bound of its bucket)."""
    total = sum(hist.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket_upper(bucket)
    return bucket_upper(max(hist))  # pragma: no cover - rank <= total


def combined(records: Iterable[TaskRecord]) -> TaskRecord:
    """Return the sum of ``records``."""
    out = TaskRecord()
    for record in records:
        out.add(record)
    return out


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0
