"""``SimpleBrokerResultBackend``: Dramatiq results in the namespace, woken by Pub/Sub.

A result lives under ``sb:{<namespace>}:dramatiq:result:<key>`` (``<key>``
is Dramatiq's message key: an MD5 of namespace, queue, actor and message
ID, or the readable form with ``use_namespace_prefix_keys``), stored with
``dramatiq_store.lua``, which also publishes on the result's wake channel.
``get_result(block=True)`` reads the result; when it is not there yet it
subscribes to that channel (through the process's one Pub/Sub listener)
and reads again, so it wakes when the result is stored, never polls, and
cannot miss a result stored in between.

In a worker whose broker is a :class:`~.broker.SimpleBrokerDramatiqBroker`
of the same namespace, a result is not written on its own: it is left on
the message (:class:`~.consumer.HeldMessage`) and stored in the same
script as the message's acknowledgement, fenced by its reservation (a
worker whose lease was taken over stores nothing).

With the task index on (the broker's ``task_index``, else
``SIMPLEBROKER_REDIS_TASK_INDEX``), the same script also notes which
result is the one of the message's ID, with the same expiry, so that the
dashboard finds a finished task by its message ID (``docs/dashboard.md``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from dramatiq.encoder import Encoder
from dramatiq.results import ResultBackend, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing, MResult
from dramatiq.results.result import wrap_exception, wrap_result

from simplebroker_redis import RedisRunner, tasks
from simplebroker_redis.activity import listener_for
from simplebroker_redis.calls import Call
from simplebroker_redis.calls import dramatiq as room
from simplebroker_redis.codec import decode_body, encode_body

from .config import choose_target
from .consumer import HeldMessage, connection_errors


class SimpleBrokerResultBackend(ResultBackend):
    """Dramatiq results stored in a SimpleBroker namespace on Valkey/Redis.

    Args:
        url: Where to connect, as for the broker (None: the environment or
            ``.broker.toml``); ignored with ``broker`` or ``runner``.
        broker: A :class:`~.broker.SimpleBrokerDramatiqBroker` whose runner
            (server and namespace) to share: results are then stored with
            acknowledgements.
        runner: A runner to share instead.
        simplebroker_namespace: The SimpleBroker namespace (with ``url``).
        namespace, encoder, use_namespace_prefix_keys: Dramatiq's own (the
            prefix of its message keys, the encoder, readable keys).
        backend_options: More ``[backend_options]`` (with ``url``).
        task_index: Note each result under its message ID too, for the
            dashboard (None: the broker's setting with ``broker``, else
            ``SIMPLEBROKER_REDIS_TASK_INDEX``, on by default).

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        broker: Any = None,
        runner: RedisRunner | None = None,
        simplebroker_namespace: str | None = None,
        namespace: str = "dramatiq-results",
        encoder: Encoder | None = None,
        use_namespace_prefix_keys: bool = False,
        backend_options: Mapping[str, Any] | None = None,
        task_index: bool | None = None,
    ) -> None:
        super().__init__(
            namespace=namespace,
            encoder=encoder,
            use_namespace_prefix_keys=use_namespace_prefix_keys,
        )
        if broker is not None:
            runner = broker.runner
            if task_index is None:
                task_index = getattr(broker, "task_index", None)
        self.task_index = tasks.enabled(task_index, tasks.INDEX_ENV)
        if runner is None:
            target = choose_target(url, simplebroker_namespace, backend_options)
            runner = target.runner()
        self.runner: RedisRunner = runner

    # -- storing ----------------------------------------------------------------------------
    def store_result(self, message: Any, result: Any, ttl: int) -> None:
        """Store ``result`` for ``ttl`` ms (with the acknowledgement of a message held here)."""
        self._put(message, wrap_result(result), ttl)

    def store_exception(self, message: Any, exception: Exception, ttl: int) -> None:
        """Store ``exception`` as the message's result for ``ttl`` ms."""
        self._put(message, wrap_exception(exception), ttl)

    def _put(self, message: Any, wrapped: Any, ttl: int) -> None:
        key = self.build_message_key(message)
        value = encode_body(self.encoder.encode(wrapped))
        ttl_ms = max(1, int(ttl))
        task_id = str(getattr(message, "message_id", "") or "") if self.task_index else ""
        if (
            isinstance(message, HeldMessage)
            and not message.settled
            and message.identity == self.runner.identity
        ):
            message.result = (key, value, ttl_ms, task_id)
            return
        self._write(key, value, ttl_ms, task_id)

    def _store(self, message_key: str, result: Any, ttl: int) -> None:
        """Store an already wrapped result (Dramatiq's hook for subclasses)."""
        self._write(message_key, encode_body(self.encoder.encode(result)), max(1, int(ttl)))

    def _write(self, key: str, value: str, ttl_ms: int, task_id: str = "") -> None:
        call = room.dramatiq_store(self.runner.keys, key, value, ttl_ms, task_id=task_id)
        with connection_errors():
            self.runner.run(call)

    # -- reading ----------------------------------------------------------------------------
    def _get(self, message_key: str) -> MResult:
        """Return the stored result of ``message_key``, or ``Missing``."""
        key = room.result_key(self.runner.keys, message_key)
        call: Call[Any] = Call(
            lambda raw: raw, command=lambda client: client.get(key), idempotent=True
        )
        with connection_errors():
            raw = self.runner.run(call)
        if raw is None:
            return Missing
        return self.encoder.decode(decode_body(raw))

    def get_result(self, message: Any, *, block: bool = False, timeout: int | None = None) -> Any:
        """Return the message's result; with ``block``, wait up to ``timeout`` ms for it.

        Raises:
            ResultMissing: Not stored yet, and ``block`` is False.
            ResultTimeout: Not stored within ``timeout`` ms (default 10 s).

        """
        key = self.build_message_key(message)
        if not block:
            found = self._get(key)
            if found is Missing:
                raise ResultMissing(message)
            return self.unwrap_result(found)
        seconds = (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
        found = self._wait(key, time.monotonic() + seconds)
        if found is Missing:
            raise ResultTimeout(message)
        return self.unwrap_result(found)

    def _wait(self, key: str, deadline: float) -> MResult:
        """Return the result of ``key`` once stored, or ``Missing`` at ``deadline``.

        A result already stored costs one read; otherwise the wait subscribes
        first and reads again, so a result stored in between is not missed.
        """
        found = self._get(key)
        if found is not Missing:
            return found
        stored = threading.Event()
        channel = self.runner.keys.wake_channel(room.result_queue(key))
        listener = listener_for(self.runner)
        listener.register([channel], stored.set)  # confirmed before the first read
        try:
            while True:
                found = self._get(key)
                left = deadline - time.monotonic()
                if found is not Missing or left <= 0:
                    return found
                stored.wait(left)
                stored.clear()
        finally:
            try:
                listener.unregister(channel, stored.set)
            except Exception:  # noqa: BLE001, S110 - the listener resubscribes on its own
                pass
