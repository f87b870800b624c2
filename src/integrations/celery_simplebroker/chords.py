"""``Chords``: a chord's header counted once per entry, and its body dispatched exactly once.

The bookkeeping follows Celery's Redis backend, in three scripts:

- ``celery_chord_size.lua``: ``apply_chord()``, which Celery calls before
  it sends the header, starts a new run (a frozen chord applied again
  reuses its group ID); ``set_chord_size()``, called as the header's last
  task is sent, stores how many entries complete the chord (a group at the
  tail of a chain in the header counts each of its tasks; ``add_to_chord()``
  adds one more, ``celery_chord_add.lua``).
- ``celery_chord_part.lua``: each finished header entry stores its result
  under ``"<task id>:<header index>"`` (a task that ran twice counts once)
  and, once the stored entries reach the size, hands the right to dispatch
  the body to exactly one caller, with every entry's result.
- ``celery_chord_dispatch.lua``: that caller's publishes (the body, or the
  error callbacks of a failed header) are staged (:mod:`.staging`), then
  written together with the chord's ``done`` mark, so a caller that died
  before that script sent nothing and gets the dispatch again when its
  task is redelivered, and one that died after it has marked the chord done.

The body gets the results in header order, read from the chord's own
entries; no worker waits for a header task. Only a header holding groups
(``apply_chord`` saves its ``GroupResult`` then, as Celery's Redis backend
does) is joined, which returns at once: every entry had finished. A header
entry that failed fails the chord with a ``ChordError`` whose ``__cause__``
is the entry's exception (a group body's tasks then fail with the exception
itself), as with Celery's Redis backend.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Iterable
from typing import Any, Final

from celery import states
from celery.canvas import maybe_signature
from celery.exceptions import ChordError
from celery.result import GroupResult, allow_join_result
from celery.utils.functional import _regen
from kombu.utils.encoding import bytes_to_str

from simplebroker_redis import RedisBrokerCore, RedisRunner, ReplicationTimeout, calls

from .entries import decode_value, encode_value
from .staging import staging

logger = logging.getLogger("celery_simplebroker")

#: Lifetime of chord bookkeeping when results never expire (seconds).
CHORD_FALLBACK_LIFETIME: Final[int] = 86_400

#: Retries of a chord's commit after a connection error (without ``result_backend_always_retry``).
DISPATCH_RETRIES: Final[int] = 5


def _chord_error(message: str, cause: BaseException) -> ChordError:
    """Return a ChordError whose ``__cause__`` is ``cause`` (as Celery's backends raise it)."""
    error = ChordError(message)
    error.__cause__ = cause if isinstance(cause, Exception) else None
    return error


def _header_index(part: str) -> float:
    """Return the header index a part's name ends with (``+inf`` when it had none)."""
    try:
        return float(part.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return math.inf


class Chords:
    """The chord methods of :class:`~.backend.SimpleBrokerBackend`, on its runner."""

    def __init__(self, backend: Any, runner: RedisRunner) -> None:
        self.backend = backend  # Celery's KeyValueStoreBackend: app, serializer, errbacks
        self.runner = runner

    @functools.cached_property
    def core(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection that writes a chord's staged messages."""
        return RedisBrokerCore(self.runner)

    def _lifetime_ms(self) -> int:
        # result_chord_expires (Celery 5.7), else the results' own lifetime.
        seconds = getattr(self.backend, "chord_expires", self.backend.expires)
        return int(seconds or CHORD_FALLBACK_LIFETIME) * 1000

    def _chord_key(self, group_id: str) -> str:
        return str(bytes_to_str(self.backend.get_key_for_chord(group_id)))

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        """Start a run of the chord; save the header's ``GroupResult`` when it holds groups.

        Celery calls this before it sends the header's first task. A frozen
        chord applied again reuses its group ID: the previous run's ``done``
        mark goes now, not at ``set_chord_size`` (the last task's send), or
        an entry finished before that would be taken for a repeated one of
        the previous run and never counted. A header of plain tasks is not
        saved: the body gets their results from the chord's entries. A
        header given as a generator is never unrolled here, so its tasks are
        sent as it yields them (Celery's #3021).
        """
        self.backend.ensure_chords_allowed()
        group_id = header_result_args[0]
        start = calls.celery_chord_size(
            self.runner.keys, self._chord_key(group_id), None, self._lifetime_ms()
        )
        self.runner.run(start)
        if isinstance(header_result_args[1], _regen):
            return
        header = self.backend.app.GroupResult(*header_result_args)
        if any(isinstance(result, GroupResult) for result in header.results):
            header.save(backend=self.backend)
            key = self.backend.get_key_for_group(header.id)
            # Celery 5.7's lifetime of saved headers (never below result_expires).
            lifetime = getattr(self.backend, "_chord_result_expires", self.backend.expires)
            self.backend.expire(key, lifetime)

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        """Store how many header entries complete the chord of ``group_id`` (a new run)."""
        call = calls.celery_chord_size(
            self.runner.keys, self._chord_key(group_id), int(chord_size), self._lifetime_ms()
        )
        self.runner.run(call)

    def add_to_chord(self, group_id: str, result: Any) -> None:
        """Make the chord of ``group_id`` wait for one more header entry (``result``'s)."""
        chord = self._chord_key(group_id)
        self.runner.run(calls.celery_chord_add(self.runner.keys, chord, self._lifetime_ms()))

    def on_chord_part_return(self, request: Any, state: str, result: Any) -> None:
        """Record a finished header entry once; the call completing the chord dispatches."""
        gid, tid = request.group, request.id
        if not gid or not tid:
            return
        backend = self.backend
        index = getattr(request, "group_index", None)
        part = f"{tid}:{'+inf' if index is None else index}"
        value = encode_value(backend.encode([1, tid, state, backend.encode_result(result, state)]))
        size = (request.chord or {}).get("chord_size") or 0  # set_chord_size's, when stored
        chord, lifetime_ms = self._chord_key(gid), self._lifetime_ms()
        count = calls.celery_chord_part(
            self.runner.keys, chord, part, value, int(size), lifetime_ms
        )
        try:
            counted = self.runner.run(count)
        except ReplicationTimeout as exc:
            # Counted on the primary: when this part completed the chord,
            # the right to dispatch it is this call's alone.
            counted = exc.result
        if counted.done:
            logger.info("chord %s already dispatched; ignoring a repeated header task", gid)
            return
        if not counted.dispatch:
            return
        callback = maybe_signature(request.chord, app=backend.app)
        with staging(self.runner.identity) as stage:
            try:
                self._dispatch(gid, callback, counted.results)
            finally:
                self._commit_dispatch(chord, part, lifetime_ms, stage.messages)

    def _dispatch(self, gid: str, callback: Any, results: Iterable[tuple[str, str]]) -> None:
        """Send the body with the header's results, or fail it (its errbacks run)."""
        backend = self.backend
        try:
            values = self._header_values(gid, results)
        except ChordError as exc:
            logger.error("chord %r raised: %r", gid, exc)
            backend.chord_error_from_stack(callback, exc)
            return
        except Exception as exc:  # noqa: BLE001 - reported as the chord's error
            logger.exception("chord %r: joining its header failed", gid)
            backend.chord_error_from_stack(callback, _chord_error(f"Join error: {exc!r}", exc))
            return
        publish = getattr(backend.app.amqp, "_retry_publish", None)
        try:
            if publish is None:  # Celery before 5.7
                callback.delay(values)
            else:
                publish(callback.delay, values)
        except Exception as exc:  # noqa: BLE001 - reported as the chord's error
            logger.exception("chord %r: sending its body failed", gid)
            backend.chord_error_from_stack(callback, _chord_error(f"Callback error: {exc!r}", exc))

    def _header_values(self, gid: str, results: Iterable[tuple[str, str]]) -> list[Any]:
        """Return the body's argument: the header's results, in header order.

        Raises ChordError (its cause the entry's exception) for a failed entry.
        """
        backend = self.backend
        header = GroupResult.restore(gid, backend=backend)
        if header is not None:  # saved by apply_chord: a header holding groups
            join = header.join_native if header.supports_native_join else header.join
            try:
                with allow_join_result():
                    joined: list[Any] = join(
                        timeout=backend.app.conf.result_chord_join_timeout, propagate=True
                    )
                    return joined
            except Exception as exc:
                culprit = next(header._failed_join_report(), None)
                reason = f"Dependency {culprit.id} raised {exc!r}" if culprit else repr(exc)
                raise _chord_error(reason, exc) from exc
        values = []
        for _, stored in sorted(results, key=lambda item: _header_index(item[0])):
            _, tid, state, value = backend.decode(decode_value(stored))
            if state in states.EXCEPTION_STATES:
                value = backend.exception_to_python(value)
            if state in states.PROPAGATE_STATES:
                raise _chord_error(f"Dependency {tid} raised {value!r}", value)
            values.append(value)
        return values

    def _commit_dispatch(
        self, chord: str, part: str, lifetime_ms: int, messages: list[tuple[str, str]]
    ) -> None:
        """Write the staged messages and mark the chord done, in one script; retried.

        A retry is safe: an attempt whose reply was lost marked the chord
        done, so the next one writes nothing (it finds the claim gone).
        """
        retries = 0
        while True:
            try:
                committed = self._commit_once(chord, part, lifetime_ms, messages)
                break
            except Exception as exc:
                pause = self._commit_pause(exc, retries)
                if pause is None:
                    raise
                retries += 1
                logger.warning("chord %s: commit failed (%s); retry in %.1f s", chord, exc, pause)
                time.sleep(pause)
        if not committed:
            logger.warning(
                "chord %s was marked done already (by another run of header task %s, or by "
                "an attempt whose reply was lost): nothing sent again",
                chord,
                part,
            )

    def _commit_pause(self, exc: Exception, retries: int) -> float | None:
        """Return the pause before retrying a chord's commit, or None to give up."""
        backend = self.backend
        if not backend.exception_safe_to_retry(exc):
            return None
        if backend.always_retry:
            if retries >= backend.max_retries:
                return None
            return float(backend.max_sleep_between_retries_ms) / 1000 * min(1.0, 2.0**retries / 64)
        if retries >= DISPATCH_RETRIES:
            return None
        return min(0.2 * 2.0**retries, 2.0)

    def _commit_once(
        self, chord: str, part: str, lifetime_ms: int, messages: list[tuple[str, str]]
    ) -> bool:
        keys = self.runner.keys
        try:
            if messages:
                outcome = self.core.run_allocating(
                    len(messages),
                    lambda candidates: calls.celery_chord_dispatch(
                        keys, chord, part, lifetime_ms, messages, candidates[0]
                    ),
                    lambda dispatch: dispatch.ids,
                )
            else:
                outcome = self.runner.run(
                    calls.celery_chord_dispatch(keys, chord, part, lifetime_ms, (), None)
                )
        except ReplicationTimeout as exc:
            # Committed on the primary; a retry would find the chord done.
            outcome = exc.result
        return bool(outcome.committed)
