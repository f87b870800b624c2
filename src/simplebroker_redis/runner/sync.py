"""``RedisRunner``: the sync runner, one pool per process, fork-safe.

A ``RedisRunner`` opens nothing until first use, and a forked child builds
its own pool the first time it touches the runner (it never reuses its
parent's sockets). Pub/Sub never uses this pool: see
:mod:`simplebroker_redis.activity`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from simplebroker.ext import MaintenanceSchedule, OperationalError

from ..calls import Call
from ..calls import init as init_call
from ..connection import Route
from ..errors import translate
from ..ids import HighWaterClock
from .base import RunnerBase, plain_call
from .durability import WAITAOF_INFO
from .wire import direct

R = TypeVar("R")


class RedisRunner(RunnerBase):
    """Process-local owner of a Redis connection pool for one namespace.

    See :class:`RunnerBase` for the arguments. Thread-safe; fork-safe.
    """

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._route: Route | None = None
        self._aof_checked = False
        self._initialized = False
        self._closed = False
        self._clock: HighWaterClock | None = None
        self._schedules: dict[int, MaintenanceSchedule] = {}
        self.maintenance_lock = threading.Lock()
        self.maintenance_due = False  #: the next write/claim carries maintenance

    @property
    def clock(self) -> HighWaterClock:
        """Return the process-wide cache of the durable high-water mark.

        Shared by every core on this runner, so a short-lived core (an
        ephemeral ``Queue`` operation) does not re-read the high-water.
        """
        clock = self._clock
        if clock is None:
            # SimpleBroker's generator reads/advances last_ts through the
            # plugin's read_last_ts/advance_last_ts hooks with this runner.
            # SimpleBroker types the runner as its SQLRunner protocol, which
            # a direct backend's runner does not implement (never used as SQL).
            clock = self._clock = HighWaterClock(
                self,  # type: ignore[arg-type]
                backend_plugin=self.backend_plugin,
            )
        return clock

    def maintenance_schedule(self, interval: int) -> MaintenanceSchedule:
        """Return the process-wide maintenance schedule for ``interval``."""
        with self.maintenance_lock:
            schedule = self._schedules.get(interval)
            if schedule is None:
                schedule = self._schedules[interval] = MaintenanceSchedule(interval)
            return schedule

    def _ensure_route(self) -> Route:
        pid = os.getpid()
        route = self._route
        if route is not None and pid == self._pid:
            return route
        if pid != self._pid:
            # Forked child: drop the parent's pools and lock without touching
            # its sockets (redis-py only shuts sockets down in their own pid).
            self._lock = threading.Lock()
            self.maintenance_lock = threading.Lock()
            self._pid = pid
            self._route = None
            self._initialized = False
        with self._lock:
            if self._closed:
                raise OperationalError(f"RedisRunner for {self.where} is closed")
            if self._route is None:
                self._route = Route(self.connections)
            return self._route

    @property
    def client(self) -> redis.Redis:
        """Return this process's client of the namespace's primary (created on first use)."""
        route = self._ensure_route()
        try:
            return route.primary()
        except redis.RedisError as exc:
            raise translate(exc, self.where) from exc

    def run(self, call: Call[R]) -> R:
        """Run ``call`` (one round trip) and return its parsed reply."""
        route = self._ensure_route()
        command = None if call.script is None else self._script_command(call)
        operation, attempt = self._operation(call, command), self._attempt(call, route.moved)
        durability = self.durability
        if durability.version_due(call, self._aof_checked):
            durability.check_version(self.run(WAITAOF_INFO))
            self._aof_checked = True
        waits = durability.wanted(call)
        while True:
            with attempt:
                client = route.primary() if attempt.ask is None else route.node(attempt.ask)
                if attempt.ask is None and not waits:
                    if command is not None:
                        return call.parse(direct(client, command))
                    return call.parse(operation(client))
                pipe, index = durability.pipeline(client, operation, call, attempt.ask is not None)
                return durability.acknowledged(
                    pipe.execute(raise_on_error=False), index, call.parse
                )
            if attempt.pause:
                time.sleep(attempt.pause)
            if attempt.remedy is not None:
                if attempt.ask is not None:  # load the scripts where ASK sent the try
                    attempt.remedied(self._on_node(route.node(attempt.ask), attempt.remedy))
                else:
                    attempt.remedied(self.run(attempt.remedy))

    def _on_node(self, client: redis.Redis, call: Call[R]) -> R:
        """Run the plain-command ``call`` once on ``client`` (a remedy on an ASK target)."""
        assert call.command is not None
        try:
            return call.parse(call.command(client))
        except redis.RedisError as exc:
            raise translate(exc, self.where) from exc

    def execute(
        self,
        operation: Callable[[redis.Redis], R],
        *,
        idempotent: bool = False,
        writes: bool = False,
    ) -> R:
        """Run plain commands ``operation(client)`` under the same failure rule.

        ``writes``: ``operation`` is one command that changes data; with the
        durability options WAIT/WAITAOF follow it.
        """
        result: R = self.run(plain_call(operation, idempotent=idempotent, writes=writes))
        return result

    def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process (1 round trip)."""
        if self._initialized and self._pid == os.getpid():
            return
        self.run(init_call("init"))
        self._initialized = True

    @property
    def initialized(self) -> bool:
        """Return whether this process already initialized or validated the namespace."""
        return self._initialized and self._pid == os.getpid()

    def mark_initialized(self, value: bool = True) -> None:
        """Record (or forget) that the namespace is known to be initialized."""
        self._initialized = value
        if value:
            self._pid = os.getpid()

    def sibling(self, timeout: float | None = None) -> RedisRunner:
        """Return a runner of the same target, options and config, with its own pool.

        For traffic that must not wait behind this runner's (a lease's
        renewal behind a busy worker's connections), or that needs a
        shorter bound (a producer's publish): ``timeout``, when given,
        bounds each connect and each command's reply, plus what WAIT and
        WAITAOF may take after a write (a ``socket_timeout`` in the target
        URL still wins, as for every runner).
        """
        other = type(self)(self.target, self.options, config=self.config)
        if self.initialized:  # the same namespace: validated already
            other.mark_initialized()
        if timeout is not None:
            connections = other.connections
            connections.connect_timeout = timeout
            connections.command_timeout = timeout + (
                2 * self.options.wait_timeout if self.options.durable else 0.0
            )
        return other

    def close(self) -> None:
        """Disconnect this process's pool; the runner reconnects on next use."""
        with self._lock:
            route, self._route = self._route, None
        if route is not None and self._pid == os.getpid():
            route.close()

    def shutdown(self) -> None:
        """Close the pool for good; later use raises ``OperationalError``."""
        self.close()
        self._closed = True
