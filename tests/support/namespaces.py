"""A namespace of a test's own, removed when the test is done with it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from simplebroker_redis import redis_backend_plugin


@contextmanager
def fresh_namespace(url: str, prefix: str = "t") -> Iterator[str]:
    """Yield an unused namespace name on ``url``; delete whatever it holds afterwards."""
    name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        redis_backend_plugin.cleanup_target(url, backend_options={"namespace": name})
