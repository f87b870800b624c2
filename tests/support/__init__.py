"""What every part of the test suite shares (``tests/`` is on ``sys.path``: import ``support.X``).

- ``waiting``: poll a condition until it holds (``wait_for``, ``eventually``).
- ``processes``: child processes of a test (workers, dashboards), their
  ``PYTHONPATH``, their output, stopping and killing them.
- ``eventlog``: the one-line-per-event log that worker apps append to and
  tests read.
- ``namespaces``: a fresh namespace, removed afterwards.
- ``state``: what a namespace stores, read straight from the server.
- ``invariants``: the storage model's invariants, and snapshots made comparable.
- ``contract``: fixtures that run a test on this backend and on SQLite.
- ``recording``: which scripts a runner ran.
- ``luakeys``: the static check that a Lua script touches only its ``KEYS``.

Worker apps run in their own processes import these modules too: their
``PYTHONPATH`` holds ``tests/`` (see :func:`support.processes.pythonpath`).
This package imports nothing at import time, so such an app pays only for
the modules it uses.
"""
