"""Durability: WAIT/WAITAOF after every state-changing call, on the write's connection.

With the backend options ``wait_replicas``/``wait_aof``, a state-changing
script (or a plain command marked ``writes``) is pipelined with ``WAIT``
and ``WAITAOF`` on the same connection, one round trip: WAIT counts the
acknowledgements of its own connection's writes. Too few raise
:class:`~simplebroker_redis.errors.ReplicationTimeout`, which carries the
operation's parsed reply (the write happened). Both runners use
:class:`Durability`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from simplebroker.ext import OperationalError

from ..calls import Call
from ..errors import ReplicationTimeout
from ..options import BackendOptions

R = TypeVar("R")


def _version(info: Any) -> tuple[int, ...]:
    text = str(info.get("valkey_version") or info.get("redis_version") or "0")
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


#: Asks for the server's version: WAITAOF (``wait_aof``) needs Valkey or Redis 7.2+.
#: (INFO rather than COMMAND INFO: the ACL line grants it, and redis-py cannot
#: parse COMMAND INFO of an unknown command.)
WAITAOF_INFO: Final[Call[tuple[int, ...]]] = Call(
    _version, command=lambda client: client.info("server"), idempotent=True
)


class Durability:
    """What a runner waits for after a call, and what a short wait means.

    Args:
        options: The runner's backend options (``wait_replicas``,
            ``wait_aof``, ``wait_timeout``).
        where: The server and namespace, as errors name them.

    """

    __slots__ = ("options", "where")

    def __init__(self, options: BackendOptions, where: str) -> None:
        self.options = options
        self.where = where

    def wanted(self, call: Call[Any]) -> bool:
        """Return whether ``call`` is followed by WAIT/WAITAOF (a state-changing script)."""
        return self.options.durable and call.changes

    def version_due(self, call: Call[Any], checked: bool) -> bool:
        """Return whether to ask the server's version (:data:`WAITAOF_INFO`) before ``call``.

        ``checked``: the runner asked already.
        """
        return not checked and self.options.wait_aof and self.wanted(call)

    def check_version(self, version: tuple[int, ...]) -> None:
        """Raise ``OperationalError`` when the server has no WAITAOF (before 7.2)."""
        if version < (7, 2):
            raise OperationalError(
                f"backend option wait_aof needs WAITAOF (Valkey or Redis 7.2+), which the "
                f"server at {self.where} does not have; nothing was written"
            )

    def pipeline(
        self, client: Any, operation: Callable[[Any], Any], call: Call[Any], ask: bool
    ) -> tuple[Any, int]:
        """Return a pipeline of ``client`` running ``call``, and the index of its reply.

        ``operation`` (``call`` as a function of a client) is queued after
        ASKING when ``ask`` (a try that ASK redirected), before the waits
        ``call`` wants.
        """
        pipe = client.pipeline(transaction=False)
        if ask:
            pipe.execute_command("ASKING")
        operation(pipe)
        if self.wanted(call):
            timeout_ms = max(1, round(self.options.wait_timeout * 1000))
            if self.options.wait_replicas:
                pipe.execute_command("WAIT", self.options.wait_replicas, timeout_ms)
            if self.options.wait_aof:
                pipe.execute_command("WAITAOF", 1, self.options.wait_replicas, timeout_ms)
        return pipe, 1 if ask else 0

    def acknowledged(self, replies: Sequence[Any], index: int, parse: Callable[[Any], R]) -> R:
        """Return the operation's parsed reply from a pipeline, checked against its waits.

        Raises the operation's error, or ``ReplicationTimeout`` for a short
        WAIT/WAITAOF; that exception carries the parsed reply (it happened).
        """
        reply = replies[index]
        if isinstance(reply, Exception):
            raise reply
        problem = self._shortfall(replies[index + 1 :])
        if problem is not None:
            raise ReplicationTimeout(
                f"the write to {self.where} happened, but within wait_timeout="
                f"{self.options.wait_timeout:g} s {problem}: it may not survive a failover",
                result=parse(reply),
            )
        return parse(reply)

    def _shortfall(self, waits: Sequence[Any]) -> str | None:
        """Return what the WAIT/WAITAOF replies ``waits`` fell short of, or None."""
        wanted = self.options.wait_replicas
        if wanted and waits:
            acked, waits = waits[0], waits[1:]
            if isinstance(acked, Exception):
                return f"WAIT failed: {acked}"
            if int(acked) < wanted:
                return f"{acked} of {wanted} replicas acknowledged it"
        if not waits:
            return None
        fsynced = waits[0]
        if isinstance(fsynced, Exception):
            return f"WAITAOF failed: {fsynced}"
        if int(fsynced[0]) < 1 or int(fsynced[1]) < wanted:
            return (
                f"the AOF of {'the primary and ' if int(fsynced[0]) else ''}"
                f"{fsynced[1]} of {wanted} replicas fsynced it"
                + ("" if int(fsynced[0]) else " (not the primary's)")
            )
        return None
