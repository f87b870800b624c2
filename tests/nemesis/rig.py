"""The system under test of one run: server(s), a fault proxy per path, workers, an admin view.

On one server every client has a proxy of its own (workers ``w0`` and
``w1``, the ``producer``), so a fault can cut off one worker alone or
everyone. In a Sentinel group every data node has the proxy instead (it
announces the proxy's port), so a partitioned primary is cut off from
clients, its replica and the sentinels alike. The admin client reaches
the server directly (through Sentinel: through the node proxies) and only
reads.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from redis.sentinel import Sentinel

from simplebroker_redis.devserver import DevNode, DevSentinelGroup, DevServer, free_ports
from simplebroker_redis.keys import Keyspace
from support.eventlog import note
from support.faultproxy import FaultProxy
from support.processes import Children, Process
from support.waiting import wait_for

from .history import HARNESS, read_history
from .workloads import Setup

if TYPE_CHECKING:
    from .scenario import Plan

#: The workers of every run (``faults.VICTIM`` is the first).
WORKERS = ("w0", "w1")
#: Password of the Sentinel group's data nodes.
PASSWORD = "nemesis-pw"


class Rig:
    """Starts and stops everything a :class:`~.scenario.Plan` runs on (a context manager)."""

    def __init__(self, plan: Plan, folder: Path) -> None:
        self.plan = plan
        self.folder = folder
        self.log = folder / HARNESS
        namespace = f"nemesis-{uuid.uuid4().hex[:10]}"
        self.keys = Keyspace.for_namespace(namespace)
        self.proxies: dict[str, FaultProxy] = {}
        self.workers: dict[str, Process] = {}
        self.children = Children(folder)
        self._server: DevServer | None = None
        self.group: DevSentinelGroup | None = None
        self._fronts: dict[int, FaultProxy] = {}  #: node port -> its proxy (Sentinel)
        self._partitioned: DevNode | None = None
        self.url = ""
        self.admin: Any = None
        self.setup = Setup(namespace, folder, plan.lease, plan.task_seconds, "")

    # -- topology ---------------------------------------------------------------------
    def _start_topology(self) -> str:
        if self.plan.fault.topology == "sentinel":
            return self._start_sentinel()
        port = free_ports(1)[0]
        extra = self.plan.fault.server_args()
        self._server = DevServer(data_dir=str(self.folder / "server"), port=port, extra_args=extra)
        self._server.start()
        for name in (*WORKERS, "producer"):
            self.proxies[name] = FaultProxy(("127.0.0.1", port)).start()
        self.admin = redis.Redis(port=port, decode_responses=True, socket_timeout=5)
        return self._server.url

    def _start_sentinel(self) -> str:
        fronts = free_ports(2)
        group = DevSentinelGroup(
            replicas=1, password=PASSWORD, down_after_ms=1500, announce_ports=fronts
        )
        self.group = group
        for node, front in zip(group.nodes, fronts, strict=True):
            self._fronts[node.port] = FaultProxy(("127.0.0.1", node.port), port=front).start()
        self.proxies = {f"node{n}": proxy for n, proxy in enumerate(self._fronts.values())}
        group.start()
        self.url = group.url
        self.admin = Sentinel(group.sentinel_addresses, socket_timeout=1).master_for(
            group.service, password=PASSWORD, decode_responses=True, socket_timeout=1
        )
        return group.url

    def url_for(self, name: str) -> str:
        """Return the URL client ``name`` uses: its own proxy, or the Sentinel group's."""
        return self.url or self.proxies[name].url()

    def cut_off(self, victims: frozenset[str]) -> list[FaultProxy]:
        """Return the proxies that cut off ``victims`` (none: every client's)."""
        if self.group is not None or not victims:
            return list(self.proxies.values())
        return [self.proxies[name] for name in victims]

    def server(self) -> DevServer:
        """Return the single server (server faults run on one)."""
        assert self._server is not None, "this fault needs the single-server topology"
        return self._server

    def partition_primary(self) -> None:
        """Blackhole the Sentinel primary's proxy: nobody reaches it any more."""
        assert self.group is not None
        self._partitioned = self.group.primary()
        self._fronts[self._partitioned.port].blackhole()

    def wait_promoted(self) -> None:
        """Wait until the sentinels name another primary than the partitioned one."""
        assert self.group is not None and self._partitioned is not None
        old = self._partitioned
        wait_for(lambda: self.group is not None and self.group.primary() is not old, 60,
                 "the sentinels to promote the replica")  # fmt: skip

    def heal_partition(self) -> None:
        """End the partition."""
        assert self.group is not None and self._partitioned is not None
        self._fronts[self._partitioned.port].heal()

    def wait_stable(self) -> None:
        """Wait until the old primary is a synced replica of the new one."""
        assert self.group is not None
        self.group.wait_stable(60)

    # -- workers ----------------------------------------------------------------------
    def start_worker(self, name: str, *, wait: bool = True) -> Process:
        """Start worker ``name`` (again, after a kill) and wait until it is ready."""
        fault = self.plan.fault
        command = self.plan.workload.command(self.setup, name, self.url_for(name))
        env = {**command.env, **fault.worker_env(name)}
        site = env.pop("NEMESIS_SKEW_SITE", None)
        if site:
            env["PYTHONPATH"] = os.pathsep.join([site, env["PYTHONPATH"]])
        worker = self.children.start(name, command.args, env, cwd=command.cwd, ready=command.ready)
        self.workers[name] = worker
        return worker.wait_ready(90) if wait else worker

    def start_workers(self) -> None:
        """Start every worker at once, then wait for each (a busy host starts them slowly)."""
        for worker in [self.start_worker(name, wait=False) for name in WORKERS]:
            worker.wait_ready(90)

    def busy(self, name: str | None) -> bool:
        """Return whether worker ``name`` (None: any) has just started a task.

        Just: in the first half of its work, so that it still runs it when
        the fault strikes a moment later (its log is read a little late).
        """
        runs = read_history(self.folder, fanout=self.plan.workload.fanout).runs
        fresh = time.time() - self.plan.task_seconds / 2
        return any(
            run.end is None and run.start > fresh and name in (None, run.worker) for run in runs
        )

    # -- what the server holds --------------------------------------------------------
    def _members(self, *which: str) -> list[str]:
        found = []
        for name in which:
            for member in self.admin.zrange(getattr(self.keys, name), 0, -1):
                if self.plan.workload.holds(member.rsplit(" ", 1)[0]):
                    found.append(member)
        return found

    def held(self) -> int:
        """Return how many of the workload's messages are reserved now."""
        return len(self._members("reserved"))

    def left(self) -> int:
        """Return how many of the workload's messages are pending, delayed or reserved."""
        return len(self._members("pending", "delayed", "reserved"))

    def stored(self, keys: Iterable[str]) -> Counter[str]:
        """Return how many stored message bodies hold each of ``keys``."""
        wanted = set(keys)
        counts: Counter[str] = Counter()
        for _, body in self.admin.hscan_iter(self.keys.bodies):
            for key in wanted:
                if key in body:
                    counts[key] += 1
        return counts

    def note(self, kind: str, *words: object) -> None:
        """Append one event to the harness's log."""
        note(self.log, kind, *words)

    def sample_held(self, stop: threading.Event) -> threading.Thread:
        """Note ``held <n>`` every 0.1 s until ``stop`` (for the duplicate bound)."""

        def sample() -> None:
            while not stop.wait(0.1):
                try:
                    self.note("held", self.held())
                except (redis.RedisError, OSError):
                    pass  # the admin path is down too (a failover): no sample

        thread = threading.Thread(target=sample, daemon=True, name="nemesis-held")
        thread.start()
        return thread

    # -- life -------------------------------------------------------------------------
    def __enter__(self) -> Rig:
        try:
            admin_url = self._start_topology()
        except BaseException:
            self.__exit__()
            raise
        self.setup = Setup(
            self.setup.namespace,
            self.folder,
            self.plan.lease,
            self.plan.task_seconds,
            admin_url,
            wait_replicas=self.plan.fault.wait_replicas,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.children.kill_all()
        if self.group is not None:  # its logs live in a temp dir that stop() removes
            for node in [*self.group.nodes, *self.group.sentinels]:
                log = Path(node.data_dir, "server.log")
                if log.exists():
                    shutil.copy(log, self.folder / f"{Path(node.data_dir).name}.server.out")
        for proxy in [*self.proxies.values()]:
            proxy.stop()
        if self.admin is not None:
            self.admin.close()
        if self._server is not None:
            self._server.stop()
        if self.group is not None:
            self.group.stop()
