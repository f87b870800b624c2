"""Shift this process's wall clock by ``$NEMESIS_CLOCK_OFFSET`` seconds (the clock fault).

First on ``PYTHONPATH`` of a worker of the clock fault: Python imports it
at start-up, before the worker app, so every later ``time.time()`` and
``time.time_ns()`` (and ``from time import time``) sees the shifted clock.
C code reading the clock itself (``datetime.now()``) does not (see
``faults.ClockSkew`` for why not libfaketime).
"""

import os
import time

_OFFSET = float(os.environ.get("NEMESIS_CLOCK_OFFSET", "0"))

if _OFFSET:
    _time, _time_ns = time.time, time.time_ns

    def _shifted() -> float:
        return _time() + _OFFSET

    def _shifted_ns() -> int:
        return _time_ns() + int(_OFFSET * 1_000_000_000)

    time.time = _shifted
    time.time_ns = _shifted_ns
