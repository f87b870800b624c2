"""A task's result written under its lease: fenced by it, retried within it.

The transport delivers a message under a reservation token (its delivery
tag is ``<token>:<id>``) and marks it with the namespace it was reserved
in (:data:`HOLDER_FIELD`, a digest of the runner's identity). The result
backend stores the result of an ``acks_late`` task, whose message is held
until the task has finished, with that token as a *fence*
(``celery_store.lua``): when the token no longer holds the message (its
lease expired while the worker was stopped or cut off, and another worker
took it over; or it was handed back), nothing is stored, so a stale
worker's late result never overwrites the current holder's (issue 42).

Because a fenced write can never overwrite a newer one, it is safe to
send again. A store that cannot reach the server is retried for up to the
lease (:class:`Retry`), so a short outage does not turn a task whose body
ran into "Exception raised outside body" and a FAILURE. If the server is
still out of reach after that, a prefork pool process hands the message
back (``Reject(requeue=True)``): the task runs again and its result is the
task's own, rather than an error about the network. (In a solo, threads,
gevent or eventlet worker the process running the task holds the message
itself, and a ``Reject`` raised there would reach Celery's consumer: the
error is raised as before.)
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from celery.exceptions import Reject

from .envelope import Tag, parse_tag
from .errors import unreachable

logger = logging.getLogger("celery_simplebroker")

T = TypeVar("T")

#: Message property naming the namespace a delivered message is reserved in.
HOLDER_FIELD: Final[str] = "x-simplebroker-holder"

#: ``CeleryStored.stored`` of a result refused by its fence (``celery_store.lua``).
FENCED: Final[int] = -2

#: First and longest pause between two tries of a result's store (seconds).
RETRY_PAUSE: Final[tuple[float, float]] = (0.05, 1.0)


def holder_mark(identity: object) -> str:
    """Return the mark of a namespace (server, credentials, namespace): a digest, no password."""
    return hashlib.sha256(repr(identity).encode("utf-8")).hexdigest()[:24]


def fence_of(app: Any, request: Any, mark: str) -> Tag | None:
    """Return (token, message ID) of the reservation a task's request ran under, or None.

    Only for an ``acks_late`` task (its message is held while it runs)
    delivered by this package's transport in the namespace ``mark`` names:
    a result stored elsewhere, or of a message acknowledged when its task
    started, has nothing to be fenced by.
    """
    properties = getattr(request, "properties", None) or {}
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or properties.get(HOLDER_FIELD) != mark:
        return None
    task = app.tasks.get(getattr(request, "task", None))
    if task is None or not task.acks_late:
        return None
    try:
        return parse_tag(tag)
    except ValueError:  # not one of this transport's tags
        return None


def in_trace(app: Any, request: Any) -> bool:
    """Return True when ``request``'s task is running in this thread (inside Celery's trace).

    Results stored there may wait and retry; the worker's event loop
    (which stores a lost worker's failure itself) must not wait.
    """
    task = app.tasks.get(getattr(request, "task", None))
    top = None if task is None else task.request_stack.top
    return top is not None and getattr(top, "id", None) == getattr(request, "id", None)


class Retry:
    """Tries of one result's store, for up to ``window`` seconds of failures to reach the server."""

    def __init__(self, what: str, window: float, *, requeue: bool) -> None:
        self.what = what
        self.window = window
        self.requeue = requeue
        self._deadline: float | None = None
        self._pause = RETRY_PAUSE[0]

    def run(self, attempt: Callable[[bool], T]) -> T:
        """Return ``attempt(first)``, tried again while the server cannot be reached.

        Raises:
            Reject: Still unreachable after ``window`` s, with ``requeue``
                (a fenced result, in a prefork pool process): its message
                goes back to the queue.
            OperationalError: The same, without ``requeue``.

        """
        first = True
        while True:
            try:
                return attempt(first)
            except Exception as exc:
                if not unreachable(exc):
                    raise
                self._wait(exc)
            first = False

    def _wait(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.window
            logger.warning(
                "storing %s failed (%s); retrying for up to %.0f s", self.what, exc, self.window
            )
        if now >= self._deadline:
            if self.requeue:
                logger.error(
                    "storing %s failed for %.0f s (%s): its message goes back to the queue, "
                    "so the task runs again and stores its own result",
                    self.what,
                    self.window,
                    exc,
                )
                raise Reject(exc, requeue=True) from exc
            raise exc
        time.sleep(min(self._pause, self._deadline - now))
        self._pause = min(self._pause * 2, RETRY_PAUSE[1])
