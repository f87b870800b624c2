"""``SimpleBrokerBackend``: Celery results in a SimpleBroker namespace, woken through Pub/Sub.

Select it with ``result_backend = "simplebroker+redis://host:6379/0"`` (the
``celery.result_backends`` entry point needs no import). Results, states
and metadata live under ``sb:{<namespace>}:celery:celery-task-meta-<id>``
(Celery's key names inside the namespace's hash tag) and expire after
``result_expires``. Storing a task's result publishes a wake-up in the same
transaction, so ``AsyncResult.get()`` and ``GroupResult.join_native()``
sleep on Pub/Sub instead of polling (``interval`` only paces
``on_interval`` callbacks; a safety re-read happens every
:data:`SAFETY_RECHECK` seconds).

Chords count each finished header entry once, whatever its task's
deliveries, and exactly one call dispatches the body:
``celery_chord_part.lua`` adds the entry to a set and, when the set is
complete, hands the dispatch to one caller atomically. That caller's
publishes are staged (:mod:`.staging`) and written together with the
chord's ``done`` mark by ``celery_chord_dispatch.lua``, so a caller that
died before that script sent nothing and gets the dispatch again when its
task is redelivered, and one that died after it has marked the chord done.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Final

import redis
from celery import states
from celery.backends.base import KeyValueStoreBackend
from celery.canvas import maybe_signature
from celery.exceptions import ChordError, TimeoutError
from celery.result import GroupResult, allow_join_result
from kombu.utils.encoding import bytes_to_str
from simplebroker.ext import OperationalError

from simplebroker_redis import AccessDenied, RedisBrokerCore, ReplicationTimeout, calls
from simplebroker_redis.activity import QueueActivityWaiter, open_waiter
from simplebroker_redis.validation import validate_queue_name

from .acks import Ahead, ResultAcks, holder_of
from .envelope import parse_tag
from .options import BACKEND_OPTIONS, make_runner, resolve_target, shown_url, warn_unknown_options
from .staging import staging
from .urls import check_app_urls

logger = logging.getLogger("celery_simplebroker")

#: Seconds between re-reads of a result while no wake-up arrives (wake-ups are hints).
SAFETY_RECHECK: Final[float] = 5.0

#: Lifetime of chord bookkeeping when results never expire (seconds).
CHORD_FALLBACK_LIFETIME: Final[int] = 86_400

#: Retries of a chord's commit after a connection error (without ``result_backend_always_retry``).
DISPATCH_RETRIES: Final[int] = 5

_BINARY = "\x00b:"  # marks a base64 value (a serializer's non-UTF-8 bytes)
_ESCAPED = "\x00t:"  # marks text that starts with NUL itself


def encode_value(value: str | bytes) -> str:
    """Return text for Redis: text verbatim (readable JSON), bytes as marked base64."""
    if isinstance(value, bytes):
        return _BINARY + base64.b64encode(value).decode("ascii")
    return _ESCAPED + value if value.startswith("\x00") else value


def decode_value(text: str | bytes | None) -> str | bytes | None:
    """Return what :func:`encode_value` was given."""
    if text is None or isinstance(text, bytes) or not text.startswith("\x00"):
        return text
    if text.startswith(_BINARY):
        return base64.b64decode(text[len(_BINARY) :])
    return text[len(_ESCAPED) :] if text.startswith(_ESCAPED) else text


def wake_name(task_id: str) -> str:
    """Return the pseudo queue whose wake-up channel announces ``task_id``'s result."""
    name = f"celery-result.{task_id}"
    try:
        return validate_queue_name(name)
    except ValueError:
        return "celery-result.x" + hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:40]


class SimpleBrokerBackend(KeyValueStoreBackend):  # type: ignore[misc] # celery is untyped
    """Celery result backend on simplebroker-redis.

    Options come from ``result_backend_transport_options``: ``namespace``,
    ``max_connections``, ``pool_timeout``.
    """

    supports_autoexpire = True
    supports_native_join = True
    implements_incr = True

    def __init__(self, app: Any = None, url: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("expires_type", int)
        super().__init__(app=app, url=url, **kwargs)
        options = self.app.conf.get("result_backend_transport_options") or {}
        check_app_urls(self.app)  # a producer may not have finalized its app yet
        self.runner = make_runner(resolve_target(url), options)
        warn_unknown_options("result_backend_transport_options", options, BACKEND_OPTIONS)
        self._core: RedisBrokerCore | None = None
        self._finishing = threading.local()  # the request mark_as_done is storing

    def __reduce__(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return super().__reduce__(args, {**(kwargs or {}), "url": self.url})

    def as_uri(self, include_password: bool = False) -> str:
        """Return the backend's URL for Celery's banner, the password hidden unless asked for."""
        return shown_url(self.url, include_password)

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        """Retry (with ``result_backend_always_retry``) when the server was unreachable.

        Never on a refusal no retry can fix (``AccessDenied``: a password, an ACL, TLS).
        """
        if isinstance(exc, AccessDenied):
            return False
        return isinstance(exc, (OperationalError, redis.ConnectionError, redis.TimeoutError))

    # -- key/value primitives ----------------------------------------------------------
    @property
    def core(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection that writes a chord's staged messages."""
        if self._core is None:
            self._core = RedisBrokerCore(self.runner)
        return self._core

    def _key(self, key: str | bytes) -> str:
        return self.runner.keys.celery_entry(bytes_to_str(key))

    def get(self, key: str | bytes) -> Any:
        """Return the stored value of ``key``, or None."""
        name = self._key(key)
        return decode_value(self.runner.execute(lambda client: client.get(name), idempotent=True))

    def mget(self, keys: Iterable[str | bytes]) -> list[Any]:
        """Return the stored values of ``keys`` (None where missing)."""
        names = [self._key(key) for key in keys]
        if not names:
            return []
        values = self.runner.execute(lambda client: client.mget(names), idempotent=True)
        return [decode_value(value) for value in values]

    def set(self, key: str | bytes, value: str | bytes) -> None:
        """Store ``value`` (expires after ``result_expires``); a task's result wakes waiters."""
        self._store(key, value, guard=False)

    def _store(
        self,
        key: str | bytes,
        value: str | bytes,
        *,
        guard: bool,
        ack: tuple[str, int] | None = None,
        ahead: Ahead | None = None,
    ) -> calls.CeleryStored:
        name = bytes_to_str(key)
        prefix = bytes_to_str(self.task_keyprefix)
        wake = wake_name(name[len(prefix) :]) if name.startswith(prefix) else None
        expires_ms = int(self.expires) * 1000 if self.expires else None
        reserve: dict[str, Any] = {}
        if ahead is not None:
            plan = ahead.reservation
            reserve = {
                "reserve_from": plan.sources,
                "reserve_limit": plan.limit,
                "lease_seconds": plan.lease_seconds,
                "max_deliveries": plan.max_deliveries,
            }
        call = calls.celery_store(
            self.runner.keys,
            name,
            encode_value(value),
            expires_ms,
            wake,
            guard=guard,
            ack=ack,
            **reserve,
        )
        return self.runner.run(call)

    def mark_as_done(
        self,
        task_id: str,
        result: Any,
        request: Any = None,
        store_result: bool = True,
        state: str = states.SUCCESS,
    ) -> None:
        """Store a finished task's result; in the worker holding it, acknowledge it too.

        See :meth:`_holder`: with ``acks_late`` in a solo, threads or gevent pool the
        result and the task message's acknowledgement are one script.
        """
        self._finishing.request = request
        try:
            super().mark_as_done(task_id, result, request, store_result, state)
        finally:
            self._finishing.request = None

    def _holder(self, request: Any) -> tuple[ResultAcks, tuple[str, int]] | None:
        """Return the registry of this process's transport holding a succeeded task's message.

        Only for the result :meth:`mark_as_done` stores, of a task with
        ``acks_late`` (Celery acknowledges it right after storing it), when
        this process holds its reservation (a solo, threads or gevent pool; a
        prefork child does not) on this backend's server and namespace.
        """
        if request is None or request is not getattr(self._finishing, "request", None):
            return None
        tag = (getattr(request, "properties", None) or {}).get("delivery_tag")
        task = self.app.tasks.get(getattr(request, "task", None))
        if not isinstance(tag, str) or task is None or not task.acks_late:
            return None
        try:
            message = parse_tag(tag)
        except ValueError:  # not one of this transport's tags
            return None
        holder = holder_of(message[0], self.runner.identity)
        if holder is None or not holder.begin(*message):
            return None
        return holder, message

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Store a task's state and result, unless it already succeeded: one script.

        Celery's key-value backends read the stored state first (a task that
        ran twice must not overwrite SUCCESS), then write; here the script
        does both atomically, and wakes the result's waiters. A succeeded
        task's message is acknowledged in the same script when this process
        holds it (:meth:`_holder`); in a solo worker's event loop the script
        also reserves the worker's next messages (``ResultAcks.ahead``).
        """
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)
        key, value = self.get_key_for_task(task_id), self.encode(meta)
        holder = self._holder(request) if state == states.SUCCESS else None
        ahead = None if holder is None else holder[0].ahead(holder[1])
        try:
            outcome = self._store(key, value, guard=True, ack=holder and holder[1], ahead=ahead)
        except ReplicationTimeout as exc:
            # Stored, acknowledged and reserved on the primary, but no
            # replica confirmed it: the acknowledgement is recorded, and the
            # messages reserved ahead are handed back rather than delivered.
            done = exc.result
            if holder is not None and isinstance(done, calls.CeleryStored) and done.stored >= 0:
                holder[0].confirmed(*holder[1], done.settlement)
                holder[0].hand_back_unconfirmed(done.reserved)
            raise
        if holder is not None and outcome.stored >= 0:
            holder[0].confirmed(*holder[1], outcome.settlement)
            if ahead is not None and outcome.reserved is not None:
                ahead.deliver(outcome.reserved)
        if outcome.stored < 0:  # not JSON: Celery's own check
            if self._get_task_meta_for(task_id)["status"] != states.SUCCESS:
                self._store(key, value, guard=False)
        return result

    def delete(self, key: str | bytes) -> None:
        """Delete ``key``."""
        name = self._key(key)
        self.runner.execute(lambda client: client.delete(name), writes=True)

    def incr(self, key: str | bytes) -> int:
        """Increment the counter ``key`` atomically and return its new value."""
        name = self._key(key)
        return int(self.runner.execute(lambda client: client.incr(name), writes=True))

    def expire(self, key: str | bytes, value: Any) -> None:
        """Let ``key`` expire after ``value`` seconds (no-op when falsy)."""
        if value:
            name, seconds = self._key(key), int(value)
            self.runner.execute(lambda client: client.expire(name, seconds), writes=True)

    # -- waiting ----------------------------------------------------------------------
    def _waiter(self, task_ids: Iterable[str]) -> QueueActivityWaiter | None:
        names = sorted({wake_name(bytes_to_str(task_id)) for task_id in task_ids})
        try:
            return open_waiter(self.runner, names, None)
        except Exception as exc:  # noqa: BLE001 - without wake-ups we re-read on a timer
            logger.debug("no result wake-ups: %s", exc)
            return None

    @staticmethod
    def _nap(waiter: QueueActivityWaiter | None, seconds: float) -> None:
        if seconds <= 0:
            return
        if waiter is None:
            time.sleep(min(seconds, 0.5))
        else:
            waiter.wait(seconds)

    @staticmethod
    def _close(waiter: QueueActivityWaiter | None) -> None:
        if waiter is not None:
            try:
                waiter.close()
            except Exception as exc:  # noqa: BLE001 - the listener recovers on its own
                logger.debug("closing a result waiter failed: %s", exc)

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Any = None,
    ) -> Any:
        """Return the task's meta once ready, woken by its result's Pub/Sub message."""
        self._ensure_not_eager()
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = self._waiter([task_id])  # subscribed before the first read
        try:
            while True:
                meta = self.get_task_meta(task_id)
                if meta["status"] in states.READY_STATES:
                    return meta
                if on_interval:
                    on_interval()
                nap = interval if on_interval else SAFETY_RECHECK
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError("The operation timed out.")
                    nap = min(nap, remaining)
                self._nap(waiter, nap)
        finally:
            self._close(waiter)

    def get_many(  # noqa: C901 - mirrors Celery's loop, plus the wake-up wait
        self,
        task_ids: Iterable[str],
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_message: Any = None,
        on_interval: Any = None,
        max_iterations: int | None = None,
        READY_STATES: frozenset[str] = states.READY_STATES,  # noqa: N803 - Celery's name
    ) -> Iterator[tuple[str, Any]]:
        """Yield (task id, meta) as results become ready, woken through Pub/Sub."""
        ids = {bytes_to_str(task_id) for task_id in task_ids}
        for task_id in list(ids):
            cached = self._cache.get(task_id)
            if cached is not None and cached["status"] in READY_STATES:
                ids.discard(task_id)
                yield task_id, cached
        if not ids:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = self._waiter(ids)
        iterations = 0
        try:
            while ids:
                keys = list(ids)
                values = self.mget([self.get_key_for_task(key) for key in keys])
                ready = self._mget_to_results(values, keys, READY_STATES)
                self._cache.update(ready)
                ids.difference_update(ready)
                for task_id, meta in ready.items():
                    if on_message is not None:
                        on_message(meta)
                    yield bytes_to_str(task_id), meta
                if not ids:
                    return
                if on_interval:
                    on_interval()
                nap = interval if on_interval else SAFETY_RECHECK
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"Operation timed out ({timeout})")
                    nap = min(nap, remaining)
                self._nap(waiter, nap)
                iterations += 1
                if max_iterations and iterations >= max_iterations:
                    return
        finally:
            self._close(waiter)

    # -- chords ---------------------------------------------------------------------------
    def _chord_lifetime(self) -> int:
        return int(self.expires) if self.expires else CHORD_FALLBACK_LIFETIME

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        """Count a finished header task once; the call completing the chord dispatches the body."""
        gid = request.group
        if not gid:
            return
        callback = maybe_signature(request.chord, app=self.app)
        size = request.chord.get("chord_size")
        deps = None
        if size is None:
            deps = self._restore(gid, callback)
            if deps is None:
                return
            size = len(deps)
        chord = bytes_to_str(self.get_key_for_chord(gid))
        lifetime = self._chord_lifetime()
        part = f"{request.id}:{getattr(request, 'group_index', None)}"
        count = calls.celery_chord_part(self.runner.keys, chord, part, int(size), lifetime * 1000)
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
            self.expire(self.get_key_for_group(gid), lifetime)
            return
        with staging(self.runner.identity) as stage:
            try:
                deps = deps or self._restore(gid, callback)
                if deps is not None:
                    self._dispatch(gid, deps, callback)
            finally:
                self._commit_dispatch(chord, part, lifetime * 1000, stage.messages)
        if deps is not None:
            deps.delete()

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
        if not self.exception_safe_to_retry(exc):
            return None
        if self.always_retry:
            if retries >= self.max_retries:
                return None
            return float(self.max_sleep_between_retries_ms) / 1000 * min(1.0, 2.0**retries / 64)
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

    def _restore(self, gid: str, callback: Any) -> Any:
        try:
            deps = GroupResult.restore(gid, backend=self)
        except Exception as exc:  # noqa: BLE001 - reported as the chord's error
            logger.exception("chord %r: cannot restore its group", gid)
            self.chord_error_from_stack(callback, ChordError(f"Cannot restore group: {exc!r}"))
            return None
        if deps is None:
            self.chord_error_from_stack(callback, ChordError(f"GroupResult {gid} no longer exists"))
        return deps

    def _dispatch(self, gid: str, deps: Any, callback: Any) -> None:
        join = deps.join_native if deps.supports_native_join else deps.join
        try:
            with allow_join_result():
                values = join(timeout=self.app.conf.result_chord_join_timeout, propagate=True)
        except Exception as exc:  # noqa: BLE001 - a failed header fails the chord
            culprit = next(deps._failed_join_report(), None)
            reason = f"Dependency {culprit.id} raised {exc!r}" if culprit else repr(exc)
            logger.error("chord %r raised: %s", gid, reason)
            self.chord_error_from_stack(callback, ChordError(reason))
            return
        try:
            callback.delay(values)
        except Exception as exc:  # noqa: BLE001 - reported as the chord's error
            logger.exception("chord %r: sending its body failed", gid)
            self.chord_error_from_stack(callback, ChordError(f"Callback error: {exc!r}"))
