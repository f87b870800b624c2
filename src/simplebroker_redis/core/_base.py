"""Shared state and helpers of the Redis broker core."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from simplebroker import resolve_config

if TYPE_CHECKING:
    from simplebroker._constants import Config

from .. import calls
from .._sbcompat import VACUUM_CLAIMED_ABSOLUTE_LIMIT
from ..calls import Call
from ..runner import RedisRunner
from ..validation import validate_message

R = TypeVar("R")

_VACUUM_SCRIPT_BATCH: Final[int] = 10_000


class CoreBase:
    """State every operation mixin shares: runner, config, clock and locks."""

    def __init__(
        self,
        runner: RedisRunner,
        *,
        config: Mapping[str, Any] | None = None,
        stop_event: threading.Event | None = None,
        owns_runner: bool = False,
    ) -> None:
        self._config = resolve_config(config=cast("Config | None", config))
        # Without a config of its own the core takes its runner's limit (the
        # runner's config, else the environment), as every writer does.
        self._max_message_size = (
            runner.max_message_size if config is None else int(self._config["MAX_MESSAGE_SIZE"])
        )
        self._runner = runner
        self._owns_runner = owns_runner
        self._stop_event = stop_event or threading.Event()
        self._lock = threading.RLock()
        self._clock = runner.clock
        self._timestamp_gen = self._clock  # SimpleBroker's name for the generator
        # One schedule per runner: short-lived cores (ephemeral Queue
        # operations) still add up to a maintenance pass.
        self._maintenance = runner.maintenance_schedule(int(self._config["AUTO_VACUUM_INTERVAL"]))
        self._ts_conflict_count = 0
        self._ts_resync_count = 0
        self._backend_plugin = runner.backend_plugin
        # thread id -> generator kind, while that thread yields an open batch
        self._open_batches: dict[int, str] = {}
        runner.ensure_initialized()

    # -- lifecycle -----------------------------------------------------------
    def set_stop_event(self, stop_event: Any) -> None:
        """Use ``stop_event`` to interrupt retry sleeps."""
        self._stop_event = stop_event or threading.Event()

    def close(self) -> None:
        """Release this handle; a borrowed runner stays open for its owner.

        A core holds no connection of its own (commands check one out of the
        runner's pool per call), so there is nothing to release here.
        """

    def shutdown(self) -> None:
        """Close this handle and the runner when this core owns it."""
        self.close()
        if self._owns_runner:
            self._runner.shutdown()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        self.close()
        return False

    def __getstate__(self) -> None:
        raise TypeError("Redis broker cores cannot be pickled; create one per process")

    # -- plumbing ------------------------------------------------------------
    @property
    def runner(self) -> RedisRunner:
        """Return the runner this core sends commands through."""
        return self._runner

    @property
    def _client(self) -> Any:
        """Return the runner's redis-py client (diagnostics and tests)."""
        return self._runner.client

    def _key(self, name: str) -> str:
        """Return the full name of the namespace's fixed key ``name``."""
        return self._runner.keys.prefix + name

    def _run(self, call: Call[R]) -> R:
        return self._runner.run(call)

    def _queue_names(self, lex_range: tuple[str, str] | None = None) -> list[str]:
        """Return the registered queue names (all, or those in a lex range), sorted."""
        key = self._runner.keys.queues

        def fetch(client: Any) -> list[str]:
            if lex_range is None:
                return [str(name) for name in client.zrange(key, 0, -1)]
            return [str(name) for name in client.zrange(key, *lex_range, bylex=True)]

        return self._runner.execute(fetch, idempotent=True)

    def _guard(self, operation: str) -> None:
        """Refuse a mutation from inside this core's own open at-least-once batch.

        Same rule and message as SimpleBroker's SQLite core: a batch being
        yielded is not committed yet, so mutating from the loop body (for
        example deleting the queue being read) must use another instance.
        """
        kind = self._open_batches.get(threading.get_ident())
        if kind is not None:
            raise RuntimeError(
                f"Cannot perform {operation} while an at_least_once {kind}_generator "
                "batch is being yielded from this BrokerDB instance. Use "
                "delivery_guarantee='exactly_once' or a separate BrokerDB/Queue instance."
            )

    def _validate_message(self, message: object) -> str:
        return validate_message(message, self._max_message_size)

    # -- maintenance -----------------------------------------------------------
    def _record_activity(self, completed: int) -> None:
        """Count committed messages; every AUTO_VACUUM_INTERVAL ask for maintenance.

        The request rides on the next write, claim or reservation of this
        runner (see ``maintain()`` in ``lua/lib/upkeep.lua``), so automatic
        maintenance costs no round trip of its own and never loops over
        queues on the client.
        """
        if self._config["AUTO_VACUUM"] != 1 or completed <= 0:
            return
        with self._runner.maintenance_lock:
            if self._maintenance.record(completed):
                # Consume the interval now so concurrent cores do not all ask.
                self._maintenance.mark_check_succeeded()
                self._runner.maintenance_due = True

    def _maintenance_spec(self) -> str:
        """Return the maintenance request for this call ('' when none is due)."""
        if self._config["AUTO_VACUUM"] != 1:
            return ""
        with self._runner.maintenance_lock:
            if not self._runner.maintenance_due:
                return ""
            self._runner.maintenance_due = False
        batch = max(1, min(int(self._config["VACUUM_BATCH_SIZE"]), _VACUUM_SCRIPT_BATCH))
        threshold = float(self._config["VACUUM_THRESHOLD"]) / 100
        return f"{batch}:{threshold:.6f}:{VACUUM_CLAIMED_ABSOLUTE_LIMIT}"

    def _vacuum_claimed(self) -> None:
        batch = max(1, min(int(self._config["VACUUM_BATCH_SIZE"]), _VACUUM_SCRIPT_BATCH))
        while True:
            removed, left = self._run(calls.vacuum(batch))
            if removed == 0 or left == 0:
                return
