"""A task too large for the broker is refused by ``kiq()``, which says why.

Taskiq turns whatever a broker's ``kick`` raises into a bare
``SendTaskError("Cannot send task to the queue")``, the reason only in its
``__cause__``; an error raised by a middleware's ``pre_send`` reaches the
caller as it is. A task's size is known once it is serialized, which Taskiq
does after every ``pre_send``. So the broker's last middleware serializes the
task (:meth:`SerializeOnce.dumps_ahead`) and checks its size, and
``kiq()``'s own serialization, right after, returns that same message
(:meth:`SerializeOnce.dumps`): no task is serialized twice. Should another
middleware's ``pre_send`` run after it (one appended to ``broker.middlewares``
by hand), the task is serialized again, as it may have changed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from taskiq.abc.formatter import TaskiqFormatter
from taskiq.message import BrokerMessage, TaskiqMessage

from .codec import stored_size
from .errors import MessageTooLargeError

#: The task serialized ahead by this context's ``kiq()`` (each ``kiq()`` runs
#: its middlewares and its serialization in one asyncio task, one context).
_AHEAD: ContextVar[tuple[TaskiqMessage, BrokerMessage] | None] = ContextVar(
    "taskiq_simplebroker_ahead", default=None
)


class SerializeOnce(TaskiqFormatter):
    """The broker's formatter (``formatter``, ``with_formatter``), serializing a task once."""

    def __init__(self, inner: TaskiqFormatter) -> None:
        self.inner = inner

    def dumps(self, message: TaskiqMessage) -> BrokerMessage:
        """Return ``message`` serialized: the one :meth:`dumps_ahead` made, if it was this one."""
        ahead = _AHEAD.get()
        if ahead is not None:
            _AHEAD.set(None)
            if ahead[0] is message:
                return ahead[1]
        return self.inner.dumps(message)

    def loads(self, message: bytes) -> TaskiqMessage:
        """Parse a stored task (the formatter given to the broker does)."""
        return self.inner.loads(message)

    def dumps_ahead(
        self, message: TaskiqMessage, check: Callable[[BrokerMessage], None], *, keep: bool
    ) -> None:
        """Serialize ``message`` and ``check`` it; ``keep`` it for the :meth:`dumps` to follow.

        Keep it only when nothing can change the message before ``kiq()``
        serializes it (no middleware's ``pre_send`` runs after this one). A
        message ``check`` refuses (it raises) is not kept.
        """
        sent = self.inner.dumps(message)
        check(sent)
        if keep:
            _AHEAD.set((message, sent))


def check_size(sent: BrokerMessage, limit: int) -> None:
    """Raise :class:`MessageTooLargeError` when ``sent`` would be stored larger than ``limit``."""
    size = stored_size(sent.message)
    if size > limit:
        raise MessageTooLargeError(
            f"task {sent.task_name!r} ({sent.task_id}) is {size} bytes as stored, more than "
            f"BROKER_MAX_MESSAGE_SIZE ({limit} bytes; SimpleBroker's default is 10 MB): "
            "pass large data by reference, or raise BROKER_MAX_MESSAGE_SIZE in the "
            "environment of every process that sends tasks"
        )
