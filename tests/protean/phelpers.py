"""What the Protean tests need beyond tests/support: paths, lease settings, the handlers' log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.processes import pythonpath

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
#: ``PYTHONPATH`` of the processes: papp.py and pworker.py here, then the package sources.
PYTHONPATH = pythonpath(HERE, SRC, SRC / "integrations")

#: Lease settings of the Redis tests: short, so recovery after a kill is quick.
LEASE = 2.0
HEARTBEAT = 0.3


def handler_calls(path: Path) -> list[dict[str, Any]]:
    """Return the handler calls papp.py logged so far (one JSON object a line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]
