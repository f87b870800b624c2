"""``python -m simplebroker_redis.metrics``: the Prometheus exporter (:mod:`.ops.metrics`)."""

from __future__ import annotations

from .ops.metrics import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
