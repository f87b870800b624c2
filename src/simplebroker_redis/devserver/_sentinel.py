"""``DevSentinelGroup``: a throwaway primary, replicas and sentinels built from dev servers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Unpack

import redis

from simplebroker_redis.devserver._node import (
    PROBE_KEY,
    TOPOLOGY_TIMEOUT,
    DevNode,
    NodeArgs,
    TlsFiles,
    check_password,
    pairs,
    wait_for,
)
from simplebroker_redis.devserver._server import DevServer, free_ports
from simplebroker_redis.devserver._topology import DevTopology


class DevSentinel(DevNode):
    """One sentinel: ``<binary> <conf> --sentinel``, its conf file in its data dir.

    With ``tls`` the sentinel reaches the data nodes and the other sentinels
    over TLS (``tls-replication yes``), so it also listens on ``tls_port``
    (which it announces to the other sentinels); clients keep the plain port.
    """

    def __init__(self, *, conf: Sequence[str], **node: Unpack[NodeArgs]) -> None:
        super().__init__(**node)
        self.conf_path = os.path.join(self.data_dir, "sentinel.conf")
        head = [
            f"port {self.port}",
            "bind 127.0.0.1",
            "daemonize no",
            f'dir "{self.data_dir}"',
            f'logfile "{os.path.join(self.data_dir, "server.log")}"',
        ]
        if self.tls is not None:
            head += [f"tls-port {self.tls_port}", "tls-replication yes"]
            head += [f'{name} "{value}"' for name, value in self.tls.settings()]
        # The sentinel rewrites this file as it learns; a restart reloads it.
        Path(self.conf_path).write_text("\n".join([*head, *conf]) + "\n", encoding="utf-8")

    def command(self) -> list[str]:
        """Return the sentinel command line (everything else is in the conf file)."""
        return [self.binary, self.conf_path, "--sentinel"]


#: ``SENTINEL DEBUG`` timings (ms) that make a dev group react within a second or two.
#: INFO and hello every 250 ms instead of 10 s and 2 s (a replaced primary is
#: reconfigured 4 hello periods after it reappears); ask the other sentinels every
#: 250 ms; a TILT (entered when the timer stalls for 2 s on a busy host) lasts 5 s,
#: not 30 s. PING every 500 ms, and neither 1 s nor 200 ms, both seen to fail:
#: a sentinel reconnects a reset link at most once per ping period, so 1 s against
#: a 1 s down-after flags a just promoted primary as down (a spurious second
#: failover); and a replica counts as promotable only if it answered within 5 ping
#: periods while the sentinel asks it for INFO once a second during a failover,
#: so 200 ms aborts the failover with ``-failover-abort-no-good-slave``.
SENTINEL_DEBUG_TIMINGS: Final[tuple[tuple[str, int], ...]] = (
    ("info-period", 250),
    ("publish-period", 250),
    ("ping-period", 500),
    ("ask-period", 250),
    ("tilt-period", 5000),
)


class DevSentinelGroup(DevTopology):
    """A throwaway Sentinel setup: one primary, ``replicas`` replicas, ``sentinels`` sentinels.

    ``password`` protects the data nodes (``requirepass`` and ``masterauth``,
    the sentinels get ``auth-pass``); ``sentinel_password`` protects the
    sentinels themselves (``requirepass`` and ``sentinel-pass``).

    With ``tls`` the data nodes also serve and replicate over TLS, and the
    sentinels monitor them (and each other) over TLS, so the sentinels name
    the data nodes' TLS ports; clients still ask the sentinels in plain TCP.
    :attr:`url` is then ``rediss+sentinel://...?ssl_ca_certs=...``.

    ``announce_ports`` (one per data node, primary first) are ports the data
    nodes name instead of their own: a TCP proxy listening on each, started
    by the caller and forwarding to the node's ``port``, then carries every
    client's, replica's and sentinel's traffic to that node, so a test can
    partition a node from all of them (see :class:`DevNode`).
    """

    def __init__(
        self,
        replicas: int = 1,
        *,
        sentinels: int = 3,
        service: str = "mymaster",
        password: str | None = None,
        sentinel_password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        appendonly: bool = False,
        binary: str | None = None,
        tls: TlsFiles | None = None,
        announce_ports: Sequence[int] | None = None,
    ) -> None:
        if replicas < 1 or sentinels < 1 or not service.isidentifier():
            raise ValueError("needs replicas >= 1, sentinels >= 1 and a plain service name")
        if announce_ports is not None and len(announce_ports) != 1 + replicas:
            raise ValueError("announce_ports needs one port per data node")
        check_password(sentinel_password)
        super().__init__(
            "sentinel", password=password, appendonly=appendonly, binary=binary, tls=tls
        )
        self.service = service
        self.sentinel_password = sentinel_password
        count = 1 + replicas + sentinels
        ports = free_ports(count if tls is None else 2 * count)  # (plain, then TLS ports)
        tls_ports: list[int | None] = [None] * count if tls is None else list(ports[count:])
        self.nodes: list[DevNode] = []
        for i in range(1 + replicas):
            args = self._node_args(f"data-{i}", ports[i], tls_ports[i])
            if announce_ports is not None:
                args["announce_port"] = announce_ports[i]
            self.nodes.append(DevNode(**args))
        for node in self.nodes[1:]:
            node.extra_args = self._replica_args(self.nodes[0])
        first = self.nodes[0].announced_port
        conf = [
            f"sentinel monitor {service} 127.0.0.1 {first} {sentinels // 2 + 1}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} {failover_timeout_ms}",
            f"sentinel parallel-syncs {service} 1",
        ]
        if password:
            conf.append(f"sentinel auth-pass {service} {password}")
        if sentinel_password:
            conf += [
                f"requirepass {sentinel_password}",
                f"sentinel sentinel-pass {sentinel_password}",
            ]
        self.sentinels: list[DevSentinel] = []
        for i in range(1 + replicas, count):
            args = self._node_args(f"sentinel-{i - 1 - replicas}", ports[i], tls_ports[i])
            args["password"] = sentinel_password
            self.sentinels.append(DevSentinel(conf=conf, **args))

    @staticmethod
    def _replica_args(primary: DevNode) -> list[str]:
        return ["--replicaof", "127.0.0.1", str(primary.announced_port)]

    @property
    def url(self) -> str:
        """Return ``redis+sentinel://[:pw@]127.0.0.1:s1,.../<service>/0`` (pw: data nodes').

        A TLS group: ``rediss+sentinel://`` (the sentinels' plain ports; TLS to
        the data nodes, verified with its CA).
        """
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return self._url(f"{seeds}/{self.service}/0")

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """Return the sentinels as ``(host, port)`` pairs (``redis.sentinel.Sentinel``'s form)."""
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def _build(self, timeout: float) -> None:
        """Start data nodes and sentinels; wait until all agree on primary and replicas."""
        for node in [*self.nodes, *self.sentinels]:
            node.start(timeout)
        for sentinel in self.sentinels:
            for name, value in SENTINEL_DEBUG_TIMINGS:
                sentinel.call("SENTINEL", "DEBUG", name, value)
        self.wait_stable(timeout)

    def primary(self) -> DevNode:
        """Return the data node that the first answering sentinel names as primary."""
        errors = []
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            try:
                return self._node_at(self._primary_port(sentinel))
            except (redis.RedisError, LookupError) as exc:
                errors.append(f"{sentinel!r}: {exc}")
        raise RuntimeError(f"no sentinel names a primary of {self.service}: {errors}")

    def replicas(self) -> list[DevNode]:
        """Return the data nodes other than the current primary."""
        primary = self.primary()
        return [node for node in self.nodes if node is not primary]

    def _primary_port(self, sentinel: DevSentinel) -> int:
        addr = sentinel.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not addr:
            raise LookupError(f"{sentinel!r} does not monitor {self.service}")
        return int(addr[1])

    def _node_at(self, port: int) -> DevNode:
        for node in self.nodes:
            if node.announced_port == port:
                return node
        raise LookupError(f"no data node listens on {port}")

    def wait_stable(self, timeout: float = TOPOLOGY_TIMEOUT) -> None:
        """Wait until every running sentinel names the same running primary, and all agree.

        The primary's ROLE is master and lists every running data node as a
        synced replica that acknowledges a probe write (WAIT); every sentinel
        knows the other sentinels and lists those replicas as healthy replicas
        of it.
        """
        wait_for(f"sentinel group {self.service}", self._stable_problem, timeout)

    def _named_ports(self) -> set[int]:
        return {self._primary_port(s) for s in self.sentinels if s.alive}

    def _stable_problem(self) -> str | None:
        named = self._named_ports()
        if len(named) != 1:
            return f"sentinels disagree on the primary: {sorted(named)}"
        primary = self._node_at(named.pop())
        if not primary.alive:
            return f"sentinels still name the dead primary {primary.port}"
        replicas = [n for n in self.nodes if n.alive and n is not primary]
        problem = self._data_problem(primary, replicas)
        for sentinel in self.sentinels:
            if problem is None and sentinel.alive:
                problem = self._sentinel_problem(sentinel, primary.announced_port, replicas)
        return problem

    def _data_problem(self, primary: DevNode, replicas: list[DevNode]) -> str | None:
        role = primary.call("ROLE")
        if role[0] != "master":
            return f"{primary.port} has role {role[0]}"
        listed = {int(entry[1]) for entry in role[2]}
        for replica in replicas:
            problem = replica.replica_link_problem(primary.announced_port)
            if problem:
                return problem
            if replica.announced_port not in listed:
                return f"primary {primary.port} does not list replica {replica.port}"
        return primary.replication_problem(PROBE_KEY, len(replicas)) if replicas else None

    def _sentinel_problem(
        self, sentinel: DevSentinel, primary_port: int, replicas: list[DevNode]
    ) -> str | None:
        master = pairs(sentinel.call("SENTINEL", "MASTER", self.service))
        if master["flags"] != "master":
            return f"{sentinel!r}: primary flags {master['flags']}"
        if int(master["num-other-sentinels"]) != len(self.sentinels) - 1:
            return f"{sentinel!r} knows {master['num-other-sentinels']} other sentinels"
        known = {
            int(entry["port"]): entry
            for entry in map(pairs, sentinel.call("SENTINEL", "REPLICAS", self.service))
        }
        for replica in replicas:
            entry = known.get(replica.announced_port, {})
            if (
                entry.get("flags") != "slave"
                or entry.get("master-link-status") != "ok"
                or int(entry.get("master-port", 0)) != primary_port
            ):
                return f"{sentinel!r} sees replica {replica.port} as {entry or 'unknown'}"
        return self._links_problem(sentinel)

    def _links_problem(self, sentinel: DevSentinel) -> str | None:
        """Return why ``sentinel`` has no working link to a running sentinel (votes need one).

        Learning of a sentinel (from its hellos) comes before connecting to it;
        over TLS the handshake makes that gap long enough to see.
        """
        running = {s.announced_port for s in self.sentinels if s.alive}
        for entry in map(pairs, sentinel.call("SENTINEL", "SENTINELS", self.service)):
            if int(entry["port"]) in running and entry["flags"] != "sentinel":
                return f"{sentinel!r} sees sentinel {entry['port']} as {entry['flags']}"
        return None

    def _moved_problem(self, old: DevNode) -> str | None:
        named = self._named_ports()
        if len(named) != 1:
            return f"sentinels disagree on the primary: {sorted(named)}"
        if named == {old.announced_port}:
            return f"sentinels still name {old.port}"
        return None

    def failover(self, timeout: float = TOPOLOGY_TIMEOUT) -> DevNode:
        """SENTINEL FAILOVER; wait until the promoted replica is everyone's primary; return it.

        The old primary must have become a synced replica of the new one.
        """
        old = self.primary()

        def request() -> str | None:
            sentinel = next(s for s in self.sentinels if s.alive)
            try:
                sentinel.call("SENTINEL", "FAILOVER", self.service)
            except redis.ResponseError as exc:  # NOGOODSLAVE / INPROG until sentinels catch up
                return f"{sentinel!r} refused FAILOVER: {exc}"
            return None

        wait_for("SENTINEL FAILOVER accepted", request, timeout)
        wait_for("sentinel failover", lambda: self._moved_problem(old), timeout)
        self.wait_stable(timeout)
        return self.primary()

    def kill_primary(self, *, restart: bool = True, timeout: float = TOPOLOGY_TIMEOUT) -> DevNode:
        """SIGKILL the primary, wait until the sentinels promoted a replica, and return it.

        With ``restart``, the old primary comes back (same port and data dir) as
        a replica of the new one, and this waits until it is synced.
        """
        old = self.primary()
        old.kill()
        wait_for("sentinel failover after kill", lambda: self._moved_problem(old), timeout)
        if restart:
            old.extra_args = self._replica_args(self.primary())
            old.start(timeout)
        self.wait_stable(timeout)
        return self.primary()

    def _processes(self) -> list[DevServer]:
        return [*self.sentinels, *self.nodes]
