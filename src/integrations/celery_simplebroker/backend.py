"""``SimpleBrokerBackend``: Celery results in a SimpleBroker namespace, woken through Pub/Sub.

Select it with ``result_backend = "simplebroker+redis://host:6379/0"`` (the
``celery.result_backends`` entry point needs no import). Results, states
and metadata live under ``sb:{<namespace>}:celery:celery-task-meta-<id>``
(Celery's key names inside the namespace's hash tag, values as
:mod:`.entries` writes them) and expire after ``result_expires``. Storing a
task's result is one script that also wakes its waiters and, in the worker
holding the task, acknowledges it.

Two parts live in modules of their own, as Celery's Redis backend keeps
its result waiting in a ``ResultConsumer``: waiting for results
(:mod:`.consumer`) and chords (:mod:`.chords`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from celery import states
from celery.backends.base import KeyValueStoreBackend
from kombu.utils.encoding import bytes_to_str
from simplebroker.ext import OperationalError

from simplebroker_redis import AccessDenied, ReplicationTimeout, calls
from simplebroker_redis.calls import celery as celery_calls
from simplebroker_redis.calls.celery import CeleryStored

from .acks import Ahead, ResultAcks, holder_of
from .chords import Chords
from .consumer import ResultConsumer
from .entries import decode_value, encode_value, wake_name
from .fencing import FENCED, Retry, fence_of, holder_mark, in_trace
from .options import (
    BACKEND_OPTIONS,
    resolve_target,
    retry_window,
    runner_options,
    shown_url,
    warn_unknown_options,
)
from .urls import check_app_urls

logger = logging.getLogger("celery_simplebroker")


class SimpleBrokerBackend(KeyValueStoreBackend):  # type: ignore[misc] # celery is untyped
    """Celery result backend on simplebroker-redis.

    Options come from ``result_backend_transport_options``: ``namespace``,
    ``max_connections``, ``pool_timeout``.
    """

    supports_autoexpire = True
    supports_native_join = True
    # Not Celery's counter-based chords (their apply_chord saves every header,
    # unrolling a generator): this backend's own, in .chords.
    implements_incr = False

    def __init__(self, app: Any = None, url: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("expires_type", int)
        super().__init__(app=app, url=url, **kwargs)
        options = self.app.conf.get("result_backend_transport_options") or {}
        check_app_urls(self.app)  # a producer may not have finalized its app yet
        self.runner = resolve_target(url).with_options(runner_options(options)).runner()
        warn_unknown_options("result_backend_transport_options", options, BACKEND_OPTIONS)
        self.consumer = ResultConsumer(self, self.runner)
        self.chords = Chords(self, self.runner)
        self._finishing = threading.local()  # the request mark_as_done is storing
        #: Marks the messages this backend's namespace reserved (see .fencing).
        self.mark = holder_mark(self.runner.identity)
        #: Seconds a result's store is retried while the server cannot be reached.
        self.retry_window = retry_window(self.app.conf)

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
    def _key(self, key: str | bytes) -> str:
        return celery_calls.entry_key(self.runner.keys, bytes_to_str(key))

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
        fence: tuple[str, int] | None = None,
        ack: bool = False,
        ahead: Ahead | None = None,
    ) -> CeleryStored:
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
                "holder": plan.holder,
            }
        call = calls.celery_store(
            self.runner.keys,
            name,
            encode_value(value),
            expires_ms,
            wake,
            guard=guard,
            fence=fence,
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
        message = fence_of(self.app, request, self.mark)
        if message is None:
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
        fence = holder[1] if holder is not None else fence_of(self.app, request, self.mark)
        # Handed back when the store gives up: only from a prefork pool process. Where
        # this process holds the message (solo, threads, gevent) a Reject raised from
        # the task's run would reach Celery's consumer, not the message.
        requeue = fence is not None and holder_of(fence[0], self.runner.identity) is None
        retry = Retry(f"the {state} of task {task_id}", self.retry_window, requeue=requeue)

        def attempt(first: bool) -> CeleryStored:
            # A retry reserves nothing ahead: the first try may have reserved already.
            ahead = holder[0].ahead(holder[1]) if holder is not None and first else None
            try:
                outcome = self._store(
                    key, value, guard=True, fence=fence, ack=holder is not None, ahead=ahead
                )
            except ReplicationTimeout as exc:
                # Stored, acknowledged and reserved on the primary, but no
                # replica confirmed it: the acknowledgement is recorded, and the
                # messages reserved ahead are handed back rather than delivered.
                done = exc.result
                if holder is not None and isinstance(done, CeleryStored) and done.stored >= 0:
                    holder[0].confirmed(*holder[1], done.settlement)
                    holder[0].hand_back_unconfirmed(done.reserved)
                raise
            if holder is not None and outcome.stored >= 0:
                holder[0].confirmed(*holder[1], outcome.settlement)
                if ahead is not None and outcome.reserved is not None:
                    ahead.deliver(outcome.reserved)
            return outcome

        outcome = retry.run(attempt) if in_trace(self.app, request) else attempt(True)
        if outcome.stored == FENCED:
            logger.warning(
                "the %s of task %s was not stored: its message is no longer held under this "
                "worker's lease (the lease expired and another worker took the task over, or "
                "the message was handed back); the current holder's result stands",
                state,
                task_id,
            )
        elif outcome.stored < 0:  # not JSON: Celery's own check
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

    # -- waiting (.consumer) and chords (.chords) ---------------------------------------
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
        return self.consumer.wait_for(task_id, timeout, interval, on_interval)

    def get_many(
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
        return self.consumer.get_many(
            task_ids, timeout, interval, on_message, on_interval, max_iterations, READY_STATES
        )

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        """Prepare a chord before its header is sent (see :meth:`.Chords.apply_chord`)."""
        self.chords.apply_chord(header_result_args, body, **kwargs)

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        """Store how many header entries complete the chord of ``group_id``."""
        self.chords.set_chord_size(group_id, chord_size)

    def add_to_chord(self, group_id: str, result: Any) -> None:
        """Make the chord of ``group_id`` wait for one more header entry."""
        self.chords.add_to_chord(group_id, result)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        """Count a finished header task once; the call completing the chord dispatches the body."""
        self.chords.on_chord_part_return(request, state, result)
