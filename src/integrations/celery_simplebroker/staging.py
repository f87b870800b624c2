"""Publishes held back while a chord is dispatched, then committed with its ``done`` mark.

The worker that completes a chord sends the body (``callback.delay(...)``,
or error callbacks when a header task failed) and marks the chord done.
Done one after the other, a worker dying between the two would leave the
chord undone with the body sent, and the header task's next run would send
it again. Instead, the result backend opens a *stage* around the dispatch:
while it is open, this thread's publishes to a queue of the same server and
namespace are recorded here rather than written (``Channel._put``), and the
backend then writes them and marks the chord done in one script
(``celery_chord_dispatch.lua``). A worker that dies before that script ran
sent nothing, so the next run dispatches once more; after it, the chord is
done and later runs send nothing.

Publishes that cannot be staged are sent as usual: a broker on another
server or namespace than the result backend, another transport, or a
fanout exchange (one broadcast script of its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

Identity = tuple[object, ...]  #: ``RedisRunner.identity``: server, credentials, namespace


@dataclass
class Stage:
    """Messages (storage queue, envelope) held back during one chord dispatch."""

    identity: Identity
    messages: list[tuple[str, str]] = field(default_factory=list)


_STAGE: ContextVar[Stage | None] = ContextVar("celery_simplebroker_stage", default=None)


@contextmanager
def staging(identity: Identity) -> Iterator[Stage]:
    """Hold back this thread's publishes to the namespace ``identity`` names."""
    stage = Stage(identity)
    token = _STAGE.set(stage)
    try:
        yield stage
    finally:
        _STAGE.reset(token)


def stage_for(identity: Identity) -> Stage | None:
    """Return the open stage of this thread when it is for ``identity``, else None."""
    stage = _STAGE.get()
    return stage if stage is not None and stage.identity == identity else None
