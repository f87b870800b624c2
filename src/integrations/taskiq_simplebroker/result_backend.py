"""``SimpleBrokerResultBackend``: Taskiq results and progress in the namespace.

Results live under ``sb:{<namespace>}:result:<task id>`` and progress under
``sb:{<namespace>}:progress:<task id>`` (inside the namespace's hash tag;
SimpleBroker's namespace cleanup removes them too). Values are JSON text by
default, readable with ``redis-cli``. A custom Taskiq serializer gets the most
faithful form it accepts: the result object itself (so ``PickleSerializer``
carries any picklable return value: custom classes, bytes), else Python
values, else the JSON-compatible form. Its bytes are stored losslessly as text (see
:mod:`.codec`).

In a worker whose broker is a :class:`~.broker.SimpleBrokerTaskiqBroker` on
the same server, a result is written in the same round trip as the task's
acknowledgement (see :mod:`.runtime`).
"""

from __future__ import annotations

from typing import Any, TypeVar, Unpack

from pydantic import BaseModel
from taskiq import AsyncResultBackend, TaskiqResult
from taskiq.abc.serializer import TaskiqSerializer
from taskiq.depends.progress_tracker import TaskProgress

from simplebroker_redis import AsyncRedisRunner
from simplebroker_redis.types import ValueWrite

from .codec import decode_body, encode_body
from .commit import ResultWrite
from .connection import DurableServerKeywords, close_runner, open_runner
from .errors import ConfigurationError, ResultIsMissingError
from .eviction import check_server
from .runtime import Runtime
from .shards import check_shards, shard_index, shard_runners

_ReturnType = TypeVar("_ReturnType")


def _expiry_ms(result_ex_time: int | None, result_px_time: int | None) -> int | None:
    for name, value in (("result_ex_time", result_ex_time), ("result_px_time", result_px_time)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigurationError(f"{name} must be an integer or None")
        if value is not None and value <= 0:
            raise ConfigurationError(f"{name} must be > 0")
    if result_ex_time is not None and result_px_time is not None:
        raise ConfigurationError("set result_ex_time or result_px_time, not both")
    if result_ex_time is not None:
        return result_ex_time * 1000
    return result_px_time


class SimpleBrokerResultBackend(AsyncResultBackend[_ReturnType]):
    """Results and progress of Taskiq tasks, stored in a SimpleBroker namespace.

    Args:
        url, allow_eviction: As for the broker
            (:class:`~.broker.SimpleBrokerTaskiqBroker`). ``redis_url`` is
            taskiq-redis's name for ``url``.
        keep_results: False: a result is consumed (deleted, with its
            progress) by the first ``get_result``, atomically.
        result_ex_time: Expire results and progress after this many seconds.
        result_px_time: ... or milliseconds (at most one of the two; neither
            keeps them until read or deleted).
        serializer: A Taskiq serializer; default: pydantic's JSON.
        shards: The broker's ``shards``: results live in the shard of their
            task ID (see :mod:`.shards`).
        server: Where to connect, as for the broker
            (:class:`~.connection.DurableServerKeywords`); typically
            ``runner=broker.runner``.

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        keep_results: bool = True,
        result_ex_time: int | None = None,
        result_px_time: int | None = None,
        serializer: TaskiqSerializer | None = None,
        allow_eviction: bool = False,
        redis_url: str | None = None,
        shards: int = 1,
        **server: Unpack[DurableServerKeywords],
    ) -> None:
        if url is not None and redis_url is not None:
            raise ConfigurationError("pass url or redis_url, not both")
        self.runner, self._owns_runner = open_runner(
            url if redis_url is None else redis_url, server, owner=type(self)
        )
        self.shards = check_shards(shards)
        self._shard_runners = shard_runners(self.runner, self.shards)
        self._runtimes: dict[str, Runtime] = {}  #: by shard namespace
        self.keep_results = bool(keep_results)
        self.expiry_ms = _expiry_ms(result_ex_time, result_px_time)
        self.serializer = serializer
        self.allow_eviction = bool(allow_eviction)
        self._runtime: Runtime | None = None
        self._check_at_startup = True

    def attach_runtime(self, runtime: Runtime) -> None:
        """Let a listening broker on the same server send results with its acks."""
        if runtime.runner.sync.identity[:2] == self.runner.sync.identity[:2]:
            self._runtime = runtime
            self._runtimes[runtime.runner.keys.namespace] = runtime

    def _shard(self, task_id: str) -> tuple[AsyncRedisRunner, Runtime | None]:
        """Return the runner of ``task_id``'s shard and the attached runtime of it, if any."""
        if self.shards == 1:
            return self.runner, self._runtime
        runner = self._shard_runners[shard_index(task_id, self.shards)]
        return runner, self._runtimes.get(runner.keys.namespace)

    def defer_server_check(self) -> None:
        """Leave the start-up check to a broker that runs it with its own.

        ``SimpleBrokerTaskiqBroker.startup`` calls this before starting its
        result backend: a worker started before its server answers then
        waits for it once, instead of failing here.
        """
        self._check_at_startup = False

    async def startup(self) -> None:
        """Refuse a server that may evict keys (see :meth:`check_server`)."""
        await super().startup()
        if self._check_at_startup:
            await self.check_server()

    async def check_server(self) -> None:
        """Raise ``EvictionPolicyError`` under ``maxmemory-policy allkeys-*`` unless allowed."""
        await check_server(
            self.runner, allow_eviction=self.allow_eviction, owner="SimpleBrokerResultBackend"
        )

    async def shutdown(self) -> None:
        """Close this backend's connections (when it owns its runner)."""
        await super().shutdown()
        self._runtime = None
        self._runtimes.clear()
        if self._owns_runner:
            await close_runner(self.runner)
        for shard in self._shard_runners:
            if shard is not self.runner:
                await close_runner(shard)

    # -- encoding ------------------------------------------------------------------
    def _dump(self, model: BaseModel) -> str:
        serializer = self.serializer
        if serializer is None:
            return model.model_dump_json()
        # The most faithful form the serializer takes: the model itself
        # (pickle: any picklable return value), else Python values (msgpack,
        # CBOR: bytes survive), else JSON-compatible values.
        for form in (lambda: model, model.model_dump):
            try:
                return encode_body(serializer.dumpb(form()))
            except Exception:  # noqa: BLE001 - try the next, plainer form
                continue
        return encode_body(serializer.dumpb(model.model_dump(mode="json")))

    def _load(self, raw: bytes | str, model: type[BaseModel]) -> Any:
        # The runner decodes replies, so values arrive as str.
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
        if self.serializer is None:
            return model.model_validate_json(text)
        return model.model_validate(self.serializer.loadb(decode_body(text)))

    @staticmethod
    async def _until_written(runtime: Runtime | None, key: str) -> None:
        if runtime is not None:
            await runtime.written(key)

    # -- results -------------------------------------------------------------------
    async def set_result(self, task_id: str, result: TaskiqResult[_ReturnType]) -> None:
        """Store the result of ``task_id`` (in a worker: with the task's ack)."""
        runner, runtime = self._shard(task_id)
        key = runner.keys.result_key(task_id)
        write = ResultWrite(key, self._dump(result), self.expiry_ms)
        if runtime is not None and runtime.stash(write, task_id):
            return
        await runner.execute(
            lambda client: client.set(write.key, write.value, px=write.px), writes=True
        )

    async def set_result_if_absent(self, task_id: str, result: TaskiqResult[_ReturnType]) -> bool:
        """Store the result of ``task_id`` unless it has one; True when stored (``SET NX``)."""
        runner, _ = self._shard(task_id)
        key = runner.keys.result_key(task_id)
        value = self._dump(result)
        stored = await runner.execute(
            lambda client: client.set(key, value, px=self.expiry_ms, nx=True), writes=True
        )
        return bool(stored)

    def journal_write(
        self, task_id: str, result: TaskiqResult[Any], runner: AsyncRedisRunner
    ) -> ValueWrite | None:
        """Return the write of ``result`` for a script run on ``runner``, or None.

        The dead-letter report stores a task's error result in the script
        that acknowledges the journal entry; that works only when this
        backend stores results in ``runner``'s namespace on the same server.
        """
        shard, _ = self._shard(task_id)
        if runner.identity != shard.identity:
            return None
        return ValueWrite(shard.keys.result_key(task_id), self._dump(result), self.expiry_ms)

    async def is_result_ready(self, task_id: str) -> bool:
        """Return whether a result of ``task_id`` is stored."""
        runner, runtime = self._shard(task_id)
        key = runner.keys.result_key(task_id)
        await self._until_written(runtime, key)
        return bool(await runner.execute(lambda client: client.exists(key), idempotent=True))

    async def get_result(self, task_id: str, with_logs: bool = False) -> TaskiqResult[_ReturnType]:
        """Return the result of ``task_id``; consume it when ``keep_results`` is False.

        Raises:
            ResultIsMissingError: No result is stored (yet, or any more).

        """
        runner, runtime = self._shard(task_id)
        key = runner.keys.result_key(task_id)
        await self._until_written(runtime, key)
        if self.keep_results:
            raw = await runner.execute(lambda client: client.get(key), idempotent=True)
        else:
            raw = await runner.execute(lambda client: client.getdel(key))
            if raw is not None:
                progress = runner.keys.progress_key(task_id)
                await runner.execute(lambda client: client.unlink(progress))
        if raw is None:
            raise ResultIsMissingError(f"no result stored for task {task_id}")
        result: TaskiqResult[_ReturnType] = self._load(raw, TaskiqResult)
        if not with_logs:
            result.log = None
        return result

    # -- progress ------------------------------------------------------------------
    async def set_progress(self, task_id: str, progress: TaskProgress[Any]) -> None:
        """Store the progress of ``task_id`` (same expiry as results)."""
        runner, _ = self._shard(task_id)
        key = runner.keys.progress_key(task_id)
        value = self._dump(progress)
        await runner.execute(lambda client: client.set(key, value, px=self.expiry_ms), writes=True)

    async def get_progress(self, task_id: str) -> TaskProgress[Any] | None:
        """Return the last progress stored for ``task_id``, or None."""
        runner, _ = self._shard(task_id)
        key = runner.keys.progress_key(task_id)
        raw = await runner.execute(lambda client: client.get(key), idempotent=True)
        if raw is None:
            return None
        progress: TaskProgress[Any] = self._load(raw, TaskProgress)
        return progress
