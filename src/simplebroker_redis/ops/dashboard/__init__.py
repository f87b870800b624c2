"""A live web dashboard of one namespace: ``python -m simplebroker_redis.dashboard``.

Needs the ``dashboard`` extra (Starlette and uvicorn). See :mod:`.app` for
what it serves and :mod:`.live` for how pages stay current without
polling; ``docs/dashboard.md`` shows it.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
