"""Which scripts a runner ran: the round trips an operation costs."""

from __future__ import annotations

from typing import Any


def record_scripts(runner: Any) -> list[str]:
    """Record the name of every script run through an AsyncRedisRunner (one round trip each)."""
    names: list[str] = []
    run = runner.run

    async def recording(call: Any) -> Any:
        if call.script is not None:
            names.append(call.script)
        return await run(call)

    runner.run = recording
    return names
