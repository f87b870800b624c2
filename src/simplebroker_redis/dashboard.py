"""``python -m simplebroker_redis.dashboard``: the web dashboard (:mod:`.ops.dashboard`)."""

from __future__ import annotations

from .ops.dashboard.__main__ import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
