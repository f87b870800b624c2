"""The faults: what each does to a running :class:`~.rig.Rig`, and how it heals.

A fault names its *victims*: the workers it cuts off alone (the checker
then expects the others to carry on, and looks for tasks the victims
started after their lease was taken over), or none when it hits every
client. Durations are in leases, so a fault outlasts the lease whatever
the run's lease is. Every wait here is on a condition (a worker busy, a
sentinel naming a new primary); holding a fault for its duration is the
one deadline.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from support.faultproxy import Direction

if TYPE_CHECKING:
    from .rig import Rig

#: The worker a victim fault hits (the rig always starts ``w0`` and ``w1``).
VICTIM = "w0"
#: A folder whose sitecustomize.py shifts time.time() by $NEMESIS_CLOCK_OFFSET.
SKEW_SITE = Path(__file__).resolve().parent / "skew"


class Fault:
    """A fault with a window (``fault`` ... ``heal`` in the log); subclasses say what it does."""

    name: str = "fault"
    #: Whether the fault has a window (a clock shift lasts the whole run).
    windowed: ClassVar[bool] = True
    #: ``single`` (one server, a proxy per client) or ``sentinel`` (a proxy per data node).
    topology: ClassVar[str] = "single"
    #: Whether the producer is the one cut off (workers start only after the heal).
    producer_fault: ClassVar[bool] = False
    #: How long the fault lasts, in leases.
    leases: float = 0.0
    #: ``wait_replicas`` every client of the run uses (0: off).
    wait_replicas: int = 0
    #: Lease seconds the run uses instead of its default (None: the default, 2 s).
    lease: float | None = None

    def server_args(self) -> list[str]:
        """Return extra server arguments this fault needs (persistence settings)."""
        return []

    def worker_env(self, name: str) -> dict[str, str]:
        """Return extra environment of worker ``name``."""
        return {}

    def clock(self, name: str) -> float:
        """Return how many seconds worker ``name``'s clock is shifted."""
        return 0.0

    def ready(self, rig: Rig) -> bool:
        """Return whether to strike now: the victim (or anyone) holds a task it started."""
        return rig.busy(VICTIM if self.victims() else None)

    def victims(self) -> frozenset[str]:
        """Return the workers cut off alone (empty: every client)."""
        return frozenset()

    def inject(self, rig: Rig) -> None:
        """Break something."""

    def hold(self, rig: Rig) -> None:
        """Keep it broken for ``leases`` leases."""
        time.sleep(self.leases * rig.setup.lease)

    def heal(self, rig: Rig) -> None:
        """Repair it; return once the repaired part serves again."""

    def settle(self, rig: Rig) -> None:
        """Wait until the system is whole again after the heal (a topology's own view)."""


class Baseline(Fault):
    """No fault at all: what the workload does undisturbed."""

    name = "none"
    windowed = False


class Blackhole(Fault):
    """Nothing moves (``direction``) between the victim, or every client, and the server."""

    def __init__(
        self, direction: Direction = "both", *, alone: bool = True, lease: float | None = None
    ) -> None:
        self.direction, self.alone, self.lease = direction, alone, lease
        way = "" if direction == "both" else "-" + direction.replace("_", "-")
        self.name = f"blackhole-{'one-worker' if alone else 'all'}{way}"
        self.leases = 2.5
        if lease:  # issue 42's setting: the frameworks' default lease, blackholed twice as long
            self.name += f"-lease{lease:g}s"
            self.leases = 2.0

    def victims(self) -> frozenset[str]:
        return frozenset({VICTIM}) if self.alone else frozenset()

    def inject(self, rig: Rig) -> None:
        for proxy in rig.cut_off(self.victims()):
            proxy.blackhole(self.direction)

    def heal(self, rig: Rig) -> None:
        for proxy in rig.cut_off(self.victims()):
            proxy.heal()


class Reset(Fault):
    """Every connection of every client reset (RST), new ones refused, for 2.5 leases."""

    name = "reset-and-refuse"
    leases = 2.5

    def inject(self, rig: Rig) -> None:
        for proxy in rig.cut_off(frozenset()):
            proxy.reset(refuse=True)

    def heal(self, rig: Rig) -> None:
        for proxy in rig.cut_off(frozenset()):
            proxy.heal()


class Latency(Fault):
    """Every chunk between clients and server held 0.3 s, for two leases."""

    name = "latency-0.3s"
    leases = 2.0

    def inject(self, rig: Rig) -> None:
        for proxy in rig.cut_off(frozenset()):
            proxy.latency(0.3)

    def heal(self, rig: Rig) -> None:
        for proxy in rig.cut_off(frozenset()):
            proxy.heal()


class Kill(Fault):
    """SIGKILL the victim (its whole process group, pool included); start it again."""

    name = "sigkill-worker"

    def victims(self) -> frozenset[str]:
        return frozenset({VICTIM})

    def inject(self, rig: Rig) -> None:
        rig.workers[VICTIM].kill()

    def heal(self, rig: Rig) -> None:
        rig.start_worker(VICTIM)


class Stop(Fault):
    """SIGSTOP the victim for 2.5 leases, then SIGCONT: a GC pause, swap, a frozen VM."""

    name = "sigstop-worker"
    leases = 2.5

    def victims(self) -> frozenset[str]:
        return frozenset({VICTIM})

    def inject(self, rig: Rig) -> None:
        rig.workers[VICTIM].signal(signal.SIGSTOP)

    def heal(self, rig: Rig) -> None:
        rig.workers[VICTIM].signal(signal.SIGCONT)


class ServerCrash(Fault):
    """``kill -9`` the server (AOF on, ``fsync`` policy), restart it on its port and data."""

    leases = 0.5

    def __init__(self, fsync: str = "always") -> None:
        self.fsync = fsync
        self.name = f"server-kill-9-aof-{fsync}"

    def server_args(self) -> list[str]:
        return ["--appendonly", "yes", "--appendfsync", self.fsync]

    def inject(self, rig: Rig) -> None:
        rig.server().kill()

    def heal(self, rig: Rig) -> None:
        rig.server().start()


class Failover(Fault):
    """Partition the Sentinel primary from everyone; sentinels promote the replica; heal.

    The old primary keeps running behind its blackholed proxy (clients,
    replica and sentinels all reach it only through that proxy); the fault
    holds until every sentinel names the replica, then one lease more.
    Every client runs with ``wait_replicas`` (default 1, README's setting
    for data that must survive a failover); with 0, the writes the old
    primary acknowledges after the heal, until the sentinels demote it,
    are lost (README, "What a failover can lose").
    """

    topology = "sentinel"
    leases = 1.0

    def __init__(self, wait_replicas: int = 1) -> None:
        self.wait_replicas = wait_replicas
        self.name = f"sentinel-failover-partitioned-primary-wait{wait_replicas}"

    def ready(self, rig: Rig) -> bool:
        return rig.busy(None)

    def inject(self, rig: Rig) -> None:
        rig.partition_primary()

    def hold(self, rig: Rig) -> None:
        rig.wait_promoted()
        super().hold(rig)

    def heal(self, rig: Rig) -> None:
        rig.heal_partition()

    def settle(self, rig: Rig) -> None:
        rig.wait_stable()


class ClockSkew(Fault):
    """Worker w0's wall clock an hour ahead, w1's an hour behind, for the whole run.

    The workers' ``time.time`` and ``time.time_ns`` are shifted from their
    start (``skew/sitecustomize.py``): the wall clock this code reads (the
    IDs of messages a worker writes, expiry checks, the apps' own logs).
    ``datetime.now()`` and C code reading the clock are not. Debian's
    libfaketime would shift those too, but it breaks Python's timed waits:
    with the monotonic clock faked, ``Event.wait(0.5)`` never returns (so
    every heartbeat thread stops: leases lapse for that reason alone), and
    with ``FAKETIME_DONT_FAKE_MONOTONIC=1``, ``time.sleep`` fails with EINVAL.
    """

    name = "clock-skew-1h"
    windowed = False
    offset = 3600.0
    #: How the clocks are shifted (the campaign's summary says it).
    how = "time.time and time.time_ns patched in the workers"

    def clock(self, name: str) -> float:
        return self.offset if name == VICTIM else -self.offset

    def worker_env(self, name: str) -> dict[str, str]:
        return {"NEMESIS_CLOCK_OFFSET": str(self.clock(name)), "NEMESIS_SKEW_SITE": str(SKEW_SITE)}

    def ready(self, rig: Rig) -> bool:
        return True


class ProducerBlackhole(Fault):
    """The producer's path blackholed while it sends; workers start after the heal."""

    name = "producer-blackhole"
    producer_fault = True
    leases = 0.0

    def ready(self, rig: Rig) -> bool:
        return True

    def victims(self) -> frozenset[str]:
        return frozenset({"producer"})

    def inject(self, rig: Rig) -> None:
        rig.proxies["producer"].blackhole()

    def hold(self, rig: Rig) -> None:
        time.sleep(rig.plan.limits.call_bound + 2)

    def heal(self, rig: Rig) -> None:
        rig.proxies["producer"].heal()


#: Every fault of ``make nemesis``, by name.
FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Baseline(),
        Blackhole(),
        Blackhole(alone=False),
        Blackhole(alone=False, lease=10.0),
        Blackhole("to_server", alone=False),
        Blackhole("to_client", alone=False),
        Reset(),
        Latency(),
        Kill(),
        Stop(),
        ServerCrash("everysec"),
        ServerCrash("always"),
        Failover(),
        Failover(wait_replicas=0),
        ClockSkew(),
        ProducerBlackhole(),
    )
}
