"""Shift this process's wall clock by ``$NEMESIS_CLOCK_OFFSET`` seconds (no libfaketime here).

On ``PYTHONPATH`` of a worker of the clock fault when Debian's libfaketime
is not installed: Python imports it at start-up, before the worker app, so
every later ``time.time()`` and ``time.time_ns()`` (and ``from time import
time``) sees the shifted clock. C code reading the clock itself does not;
libfaketime shifts those too.
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
