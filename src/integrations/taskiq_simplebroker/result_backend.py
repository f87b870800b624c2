"""``SimpleBrokerResultBackend``: Taskiq results and progress in the namespace.

Results live under ``sb:{<namespace>}:result:<task id>`` and progress under
``sb:{<namespace>}:progress:<task id>`` (inside the namespace's hash tag;
SimpleBroker's namespace cleanup removes them too). Values are JSON text by
default, readable with ``redis-cli``; with a custom Taskiq serializer they
are stored losslessly as text (see :mod:`.codec`).

In a worker whose broker is a :class:`~.broker.SimpleBrokerTaskiqBroker` on
the same server, a result is written in the same round trip as the task's
acknowledgement (see :mod:`.runtime`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel
from taskiq import AsyncResultBackend, TaskiqResult
from taskiq.abc.serializer import TaskiqSerializer
from taskiq.depends.progress_tracker import TaskProgress

from simplebroker_redis.aio import AsyncRedisRunner

from .codec import decode_body, encode_body
from .commit import ResultWrite
from .connection import close_runner, make_runner
from .errors import ConfigurationError, ResultIsMissingError
from .runtime import Runtime

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
        url: Server URL (default ``$SIMPLEBROKER_REDIS_URL``).
        runner: An existing :class:`~simplebroker_redis.aio.AsyncRedisRunner`
            to share, typically ``broker.runner``.
        namespace: SimpleBroker namespace of the keys.
        keep_results: False: a result is consumed (deleted, with its
            progress) by the first ``get_result``, atomically.
        result_ex_time: Expire results and progress after this many seconds.
        result_px_time: ... or milliseconds (at most one of the two; neither
            keeps them until read or deleted).
        serializer: A Taskiq serializer; default: pydantic's JSON.
        max_connections: Size of the connection pool (when ``url`` is used).

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        runner: AsyncRedisRunner | None = None,
        namespace: str | None = None,
        keep_results: bool = True,
        result_ex_time: int | None = None,
        result_px_time: int | None = None,
        serializer: TaskiqSerializer | None = None,
        max_connections: int = 50,
    ) -> None:
        self._owns_runner = runner is None
        self.runner = make_runner(url, runner, namespace, max_connections)
        self.keep_results = bool(keep_results)
        self.expiry_ms = _expiry_ms(result_ex_time, result_px_time)
        self.serializer = serializer
        self._runtime: Runtime | None = None

    def attach_runtime(self, runtime: Runtime) -> None:
        """Let a listening broker on the same server send results with its acks."""
        if runtime.runner.sync.identity[:2] == self.runner.sync.identity[:2]:
            self._runtime = runtime

    async def shutdown(self) -> None:
        """Close this backend's connections (when it owns its runner)."""
        await super().shutdown()
        self._runtime = None
        if self._owns_runner:
            await close_runner(self.runner)

    # -- encoding ------------------------------------------------------------------
    def _dump(self, model: BaseModel) -> str:
        if self.serializer is None:
            return model.model_dump_json()
        return encode_body(self.serializer.dumpb(model.model_dump(mode="json")))

    def _load(self, raw: bytes | str, model: type[BaseModel]) -> Any:
        # The runner decodes replies, so values arrive as str.
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
        if self.serializer is None:
            return model.model_validate_json(text)
        return model.model_validate(self.serializer.loadb(decode_body(text)))

    async def _settled(self, key: str) -> None:
        runtime = self._runtime
        if runtime is not None:
            await runtime.written(key)

    # -- results -------------------------------------------------------------------
    async def set_result(self, task_id: str, result: TaskiqResult[_ReturnType]) -> None:
        """Store the result of ``task_id`` (in a worker: with the task's ack)."""
        key = self.runner.keys.result_key(task_id)
        write = ResultWrite(key, self._dump(result), self.expiry_ms)
        runtime = self._runtime
        if runtime is not None and runtime.stash(write):
            return
        await self.runner.execute(lambda client: client.set(write.key, write.value, px=write.px))

    async def is_result_ready(self, task_id: str) -> bool:
        """Return whether a result of ``task_id`` is stored."""
        key = self.runner.keys.result_key(task_id)
        await self._settled(key)
        return bool(await self.runner.execute(lambda client: client.exists(key), idempotent=True))

    async def get_result(self, task_id: str, with_logs: bool = False) -> TaskiqResult[_ReturnType]:
        """Return the result of ``task_id``; consume it when ``keep_results`` is False.

        Raises:
            ResultIsMissingError: No result is stored (yet, or any more).

        """
        key = self.runner.keys.result_key(task_id)
        await self._settled(key)
        if self.keep_results:
            raw = await self.runner.execute(lambda client: client.get(key), idempotent=True)
        else:
            raw = await self.runner.execute(lambda client: client.getdel(key))
            if raw is not None:
                progress = self.runner.keys.progress_key(task_id)
                await self.runner.execute(lambda client: client.unlink(progress))
        if raw is None:
            raise ResultIsMissingError(f"no result stored for task {task_id}")
        result: TaskiqResult[_ReturnType] = self._load(raw, TaskiqResult)
        if not with_logs:
            result.log = None
        return result

    # -- progress ------------------------------------------------------------------
    async def set_progress(self, task_id: str, progress: TaskProgress[Any]) -> None:
        """Store the progress of ``task_id`` (same expiry as results)."""
        key = self.runner.keys.progress_key(task_id)
        value = self._dump(progress)
        await self.runner.execute(lambda client: client.set(key, value, px=self.expiry_ms))

    async def get_progress(self, task_id: str) -> TaskProgress[Any] | None:
        """Return the last progress stored for ``task_id``, or None."""
        key = self.runner.keys.progress_key(task_id)
        raw = await self.runner.execute(lambda client: client.get(key), idempotent=True)
        if raw is None:
            return None
        progress: TaskProgress[Any] = self._load(raw, TaskProgress)
        return progress
