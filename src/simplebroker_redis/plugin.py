"""The ``redis`` SimpleBroker backend plugin (entry point glue only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, cast

from simplebroker.ext import ActivityWaiter, BackendPlugin, BrokerConnection

from . import calls
from . import namespace as namespace_ops
from ._sbcompat import guard_connection_retry
from .activity import open_waiter
from .core import RedisBrokerCore
from .keys import SCHEMA_VERSION, format_id
from .options import BackendOptions
from .runner import RedisRunner, RunnerBase, shared_runner
from .targets import normalize_target

#: A target's ``[backend_options]``, as SimpleBroker passes them (None: the defaults).
Options = Mapping[str, Any] | None
#: SimpleBroker's config, as it passes it (None: read from the environment).
Config = Mapping[str, Any] | None


def _not_sql(hook: str) -> NoReturn:
    raise NotImplementedError(
        f"{hook} is a SQL-runner hook; the redis backend is a direct backend and "
        "SimpleBroker never calls it"
    )


class RedisBackendPlugin:
    """SimpleBroker backend plugin for Valkey 7+ and Redis 7+ (backend API v9)."""

    name = "redis"
    sql = None
    backend_api_version = 9
    schema_version = SCHEMA_VERSION
    is_direct_backend = True

    # -- targets and options ---------------------------------------------------
    def init_backend(
        self,
        config: Mapping[str, Any],
        *,
        toml_target: str = "",
        toml_options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Validate a target and options (``.broker.toml`` or environment)."""
        target = toml_target or str(config.get("BACKEND_TARGET") or "")
        if not target:
            raise ValueError(
                "the redis backend needs a target: set target in .broker.toml or "
                "BROKER_BACKEND_TARGET (for example redis://127.0.0.1:6379/0)"
            )
        normalize_target(target)
        options = BackendOptions.parse(toml_options)
        return {"target": target, "backend_options": options.to_dict()}

    def _runner_for(self, target: str, backend_options: Options, config: Config) -> RedisRunner:
        return shared_runner(target, BackendOptions.parse(backend_options), config)

    def create_runner(
        self, target: str, *, backend_options: Options = None, config: Config = None
    ) -> RedisRunner:
        """Return a new runner owned by the caller (closed by its ``shutdown``)."""
        return RedisRunner(target, BackendOptions.parse(backend_options), config=config)

    def create_core(
        self,
        target: str,
        *,
        backend_options: Options = None,
        config: Config = None,
        stop_event: Any = None,
    ) -> BrokerConnection:
        """Return a core borrowing the process-wide runner of this target."""
        runner = self._runner_for(target, backend_options, config)
        return RedisBrokerCore(runner, config=config, stop_event=stop_event)

    def create_core_from_runner(
        self, runner: Any, *, config: Config = None, stop_event: Any = None
    ) -> BrokerConnection:
        """Return a core borrowing ``runner`` (which stays caller-owned)."""
        if not isinstance(runner, RedisRunner):
            raise TypeError("the redis backend needs a simplebroker_redis.RedisRunner")
        return RedisBrokerCore(runner, config=config, stop_event=stop_event)

    # -- namespace lifecycle -----------------------------------------------------
    def initialize_target(
        self, target: str, *, backend_options: Options = None, config: Config = None
    ) -> None:
        """Create the namespace if needed (idempotent)."""
        runner = self._runner_for(target, backend_options, config)
        namespace_ops.check_server_version(runner)
        namespace_ops.initialize(runner)

    # The same signature shape as create_core's: both are SimpleBroker's
    # BackendPlugin hooks, whose keyword-only names it passes. What they
    # share beyond that, resolving the shared runner, is _runner_for.
    def validate_target(
        self,
        target: str,
        *,
        backend_options: Options = None,
        verify_initialized: bool = True,
        config: Config = None,
    ) -> None:
        """Raise unless the namespace is (or can become) a valid one."""
        runner = self._runner_for(target, backend_options, config)
        namespace_ops.validate(runner, verify_initialized=verify_initialized)

    def cleanup_target(
        self, target: str, *, backend_options: Options = None, config: Config = None
    ) -> bool:
        """Delete exactly this namespace; return whether it held anything."""
        return namespace_ops.cleanup(self._runner_for(target, backend_options, config))

    def check_version(self) -> None:
        """Server versions are checked when a target is initialized."""

    # -- timestamp hooks used by SimpleBroker's TimestampGenerator ----------------
    def read_last_ts(self, runner: RedisRunner) -> int:
        """Return the durable high-water mark (0 for an empty namespace)."""
        return namespace_ops.read_last_ts(runner)

    def advance_last_ts(self, runner: RedisRunner, *, new_ts: int) -> bool:
        """Raise the durable high-water to ``new_ts``; return whether it moved."""
        return runner.run(calls.advance_ts(new_ts))

    def write_last_ts(self, runner: RedisRunner, ts: int) -> None:
        """Overwrite the durable high-water mark (repair tools and tests only)."""
        key = runner.keys.meta
        runner.execute(lambda client: client.hset(key, "last_ts", format_id(ts)), writes=True)

    def read_magic(self, runner: RedisRunner) -> str | None:
        """Return the namespace magic string, or None."""
        return namespace_ops.read_magic(runner)

    def read_schema_version(self, runner: RedisRunner) -> int:
        """Return the stored schema version (0 when absent)."""
        return namespace_ops.read_meta_int(runner, "schema_version")

    def read_alias_version(self, runner: RedisRunner) -> int:
        """Return the alias version."""
        return namespace_ops.read_meta_int(runner, "alias_version")

    def get_data_version(self, runner: RedisRunner) -> int | None:
        """Return None: change detection uses Pub/Sub waiters instead."""
        return None

    # -- activity waiters ----------------------------------------------------------
    def create_activity_waiter(
        self,
        *,
        target: str | None,
        backend_options: Options = None,
        runner: Any = None,
        queue_name: str,
        stop_event: Any,
    ) -> ActivityWaiter | None:
        """Return a Pub/Sub waiter woken when ``queue_name`` gets pending work."""
        return self.create_activity_waiter_for_queues(
            target=target,
            backend_options=backend_options,
            runner=runner,
            queue_names=(queue_name,),
            stop_event=stop_event,
        )

    def create_activity_waiter_for_queues(
        self,
        *,
        target: str | None,
        backend_options: Options = None,
        runner: Any = None,
        queue_names: Sequence[str],
        stop_event: Any,
    ) -> ActivityWaiter | None:
        """Return one Pub/Sub waiter for several queues."""
        if runner is None:
            if target is None:
                return None
            runner = self._runner_for(target, backend_options, None)
        return open_waiter(runner, queue_names, stop_event)

    # -- SQL-runner hooks (never used by a direct backend) ---------------------------
    def apply_connection_settings(self, conn: Any, **kwargs: Any) -> None:
        """Not used: the redis backend has no SQL connections."""
        _not_sql("apply_connection_settings")

    def apply_optimization_settings(self, conn: Any, **kwargs: Any) -> None:
        """Not used: the redis backend has no SQL connections."""
        _not_sql("apply_optimization_settings")

    def setup_connection_phase(self, target: str, **kwargs: Any) -> None:
        """Not used: the redis backend has no SQL connections."""
        _not_sql("setup_connection_phase")

    def initialize_database(self, runner: Any, *, run_with_retry: Callable[..., Any]) -> None:
        """Not used: see :meth:`initialize_target`."""
        _not_sql("initialize_database")

    def meta_table_exists(self, runner: Any) -> bool:
        """Not used: the redis backend has no tables."""
        _not_sql("meta_table_exists")

    def migrate_schema(self, runner: Any, **kwargs: Any) -> None:
        """Not used: schema version 1 is the only Redis schema."""
        _not_sql("migrate_schema")


redis_backend_plugin = RedisBackendPlugin()

# The runners' documented back-pointer to their plugin (SimpleBroker's
# BackendAwareRunner contract), set here so no lower layer imports this one.
RunnerBase.backend_plugin = cast("BackendPlugin", redis_backend_plugin)

# SimpleBroker loads this module when it resolves the backend, before it opens
# a connection: a wrong password then fails at once, not after 6 s (_sbcompat).
guard_connection_retry()
