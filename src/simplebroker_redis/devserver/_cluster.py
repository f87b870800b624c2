"""``DevCluster``: a throwaway Redis Cluster built from dev servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Unpack

from redis.crc import key_slot

from simplebroker_redis.devserver._node import (
    PROBE_KEY,
    TOPOLOGY_TIMEOUT,
    DevNode,
    NodeArgs,
    TlsFiles,
    wait_for,
)
from simplebroker_redis.devserver._server import DevServer, free_ports
from simplebroker_redis.devserver._topology import DevTopology

#: Number of hash slots of a Redis Cluster.
CLUSTER_SLOTS: Final[int] = 16384


@dataclass(frozen=True)
class _ClusterView:
    """One line of ``CLUSTER NODES``: what one node believes about another."""

    node_id: str
    flags: frozenset[str]
    master_id: str
    link: str
    slots: tuple[str, ...]
    moving: tuple[str, ...]

    @property
    def role(self) -> str:
        """Return ``master`` or ``slave``."""
        return "master" if "master" in self.flags else "slave"

    def owns(self, slot: int) -> bool:
        """Return whether the slot ranges of this line include ``slot``."""
        for token in self.slots:
            low, _, high = token.partition("-")
            if int(low) <= slot <= int(high or low):
                return True
        return False


def _parse_cluster_nodes(text: str) -> dict[str, _ClusterView]:
    """Parse a ``CLUSTER NODES`` reply."""
    views: dict[str, _ClusterView] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        tail = fields[8:]
        views[fields[0]] = _ClusterView(
            node_id=fields[0],
            flags=frozenset(fields[2].split(",")),
            master_id=fields[3],
            link=fields[7],
            slots=tuple(t for t in tail if not t.startswith("[")),
            moving=tuple(t for t in tail if t.startswith("[")),
        )
    return views


def _probe_key(view: _ClusterView) -> str:
    """Return a replication probe key in a slot that ``view``'s node serves."""
    i = 0
    while True:
        key = f"{PROBE_KEY}:{i}"
        if view.owns(key_slot(key.encode())):
            return key
        i += 1


#: Flags that a reachable, fully joined cluster node never carries.
_UNHEALTHY_FLAGS: Final = frozenset({"fail", "fail?", "handshake", "noaddr"})


class DevClusterNode(DevNode):
    """One cluster node: a DevServer with a cluster bus port and, once started, a node ID.

    A TLS node also runs its cluster bus over TLS (``tls-cluster yes``): it
    then names TLS ports to TLS clients (CLUSTER SLOTS, MOVED) and plain
    ports to plain ones.
    """

    def __init__(self, *, bus_port: int, node_timeout_ms: int, **node: Unpack[NodeArgs]) -> None:
        super().__init__(**node)
        self.bus_port = bus_port
        self.node_timeout_ms = node_timeout_ms
        self.node_id = ""

    def command(self) -> list[str]:
        """Return the server command line of a cluster node."""
        args = [
            *super().command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(self.bus_port),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may always take over, however stale, and replicas never move
            # to another primary on their own: the layout stays what the test built.
            "--cluster-replica-validity-factor", "0",
            "--cluster-allow-replica-migration", "no",
        ]  # fmt: skip
        if self.tls is not None:
            args += ["--tls-cluster", "yes"]
        return args

    def views(self) -> dict[str, _ClusterView]:
        """Return this node's ``CLUSTER NODES`` view, by node ID."""
        return _parse_cluster_nodes(self.call("CLUSTER", "NODES"))

    def cluster_info(self) -> dict[str, str]:
        """Return this node's ``CLUSTER INFO`` fields."""
        text: str = self.call("CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def __repr__(self) -> str:
        return f"DevClusterNode(port={self.port}, id={self.node_id[:8]})"


class DevCluster(DevTopology):
    """A throwaway Redis Cluster: ``primaries`` primaries with ``replicas`` replicas each.

    Built with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE (no interactive tool);
    ``start()`` returns once every node reports ``cluster_state:ok`` and all
    nodes agree on the nodes, roles and slot map.

    With ``tls`` every node also has a TLS port, and the cluster bus and
    replication run over TLS; :attr:`url` then names the TLS ports
    (``rediss+cluster://...?ssl_ca_certs=...``). Admin calls use the plain ports.
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 0,
        *,
        node_timeout_ms: int = 2000,
        password: str | None = None,
        appendonly: bool = False,
        binary: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        if primaries < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one primary and replicas >= 0")
        super().__init__(
            "cluster", password=password, appendonly=appendonly, binary=binary, tls=tls
        )
        count = primaries * (1 + replicas)
        per_node = 2 if tls is None else 3  # client, bus (and TLS) ports
        ports = free_ports(per_node * count)
        self.nodes: list[DevClusterNode] = [
            DevClusterNode(
                bus_port=ports[per_node * i + 1],
                node_timeout_ms=node_timeout_ms,
                **self._node_args(
                    f"node-{i}",
                    ports[per_node * i],
                    None if tls is None else ports[per_node * i + 2],
                ),
            )
            for i in range(count)
        ]
        #: Initial layout: replica -> its primary (nodes[:primaries] are the primaries).
        self._layout = {
            self.nodes[primaries + p * replicas + r]: self.nodes[p]
            for p in range(primaries)
            for r in range(replicas)
        }
        self._primary_count = primaries

    @property
    def url(self) -> str:
        """Return ``redis+cluster://[:pw@]127.0.0.1:p1,127.0.0.1:p2,...`` (every node a seed).

        A TLS cluster: ``rediss+cluster://`` to the TLS ports, verified with its CA.
        """
        return self._url(",".join(f"127.0.0.1:{port}" for _, port in self.seeds))

    @property
    def seeds(self) -> list[tuple[str, int]]:
        """Return every node's client address ``(host, port)``: its TLS port in a TLS cluster."""
        return [("127.0.0.1", node.announced_port) for node in self.nodes]

    def _build(self, timeout: float) -> None:
        for node in self.nodes:
            node.start(timeout)
        for epoch, node in enumerate(self.nodes, start=1):
            node.node_id = node.call("CLUSTER", "MYID")
            # Distinct epochs up front, as valkey-cli does: no epoch collisions to resolve.
            node.call("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        count = self._primary_count
        for i, node in enumerate(self.nodes[:count]):
            first, last = i * CLUSTER_SLOTS // count, (i + 1) * CLUSTER_SLOTS // count - 1
            node.call("CLUSTER", "ADDSLOTSRANGE", first, last)
        for node in self.nodes[1:]:
            meet = ("CLUSTER", "MEET", "127.0.0.1", node.announced_port, node.bus_port)
            self.nodes[0].call(*meet)
        wait_for("cluster handshake (every node knows every node)", self._met_problem, timeout)
        for replica, primary in self._layout.items():
            replica.call("CLUSTER", "REPLICATE", primary.node_id)
        self.wait_stable(timeout)

    def _met_problem(self) -> str | None:
        for node in self.nodes:
            views = node.views()
            if len(views) != len(self.nodes):
                return f"{node!r} knows {len(views)} of {len(self.nodes)} nodes"
            if any("handshake" in view.flags for view in views.values()):
                return f"{node!r} is still in handshake"
        return None

    def wait_stable(self, timeout: float = TOPOLOGY_TIMEOUT, *, allow_down: bool = False) -> None:
        """Wait until every running node agrees on nodes, roles and slots, and sees dead ones fail.

        Without ``allow_down`` also every running node must report
        ``cluster_state:ok`` and no dead node may own slots. Replicas must
        have a live link, and a write on each primary must reach them (WAIT).
        """
        wait_for("cluster", lambda: self._stable_problem(allow_down), timeout)

    def _stable_problem(self, allow_down: bool) -> str | None:
        dead = {node.node_id for node in self.nodes if not node.alive}
        reference: dict[str, tuple[str, str, tuple[str, ...]]] | None = None
        first: DevClusterNode | None = None
        agreed: dict[str, _ClusterView] = {}
        for node in self.nodes:
            if not node.alive:
                continue
            info = node.cluster_info()
            if not allow_down and info.get("cluster_state") != "ok":
                return f"{node!r}: cluster_state:{info.get('cluster_state')}"
            views = node.views()
            problem = self._views_problem(node, views, dead, allow_down)
            if problem:
                return problem
            summary = {i: (v.role, v.master_id, v.slots) for i, v in views.items() if i not in dead}
            if reference is None:
                reference, first = summary, node
            elif summary != reference:
                return f"{node!r} disagrees with {first!r} on roles or slots"
            if views[node.node_id].role == "slave":
                primary = self._by_id(views[node.node_id].master_id)
                problem = node.replica_link_problem(primary.announced_port)
                if problem:
                    return problem
            agreed = views
        return self._replication_problem(agreed) if first is not None else None

    def _replication_problem(self, views: dict[str, _ClusterView]) -> str | None:
        """Return why a running primary's writes do not reach its running replicas yet."""
        for node in self.nodes:
            view = views[node.node_id]
            if not node.alive or view.role != "master" or not view.slots:
                continue
            replicas = [
                n for n in self.nodes if n.alive and views[n.node_id].master_id == node.node_id
            ]
            if replicas:
                problem = node.replication_problem(_probe_key(view), len(replicas))
                if problem:
                    return problem
        return None

    def _views_problem(
        self, node: DevClusterNode, views: dict[str, _ClusterView], dead: set[str], allow_down: bool
    ) -> str | None:
        if set(views) != {n.node_id for n in self.nodes}:
            return f"{node!r} knows {len(views)} nodes, not the {len(self.nodes)} of this cluster"
        for node_id, view in views.items():
            other = self._by_id(node_id)
            if view.moving:
                return f"{node!r}: slot migration in progress on {other!r}: {view.moving}"
            if node_id in dead:
                if "fail" not in view.flags:
                    return f"{node!r} does not flag dead {other!r} as fail yet"
                if view.slots and not allow_down:
                    return f"{node!r}: dead {other!r} still owns slots (no failover yet)"
            elif view.flags & _UNHEALTHY_FLAGS or view.link != "connected":
                return f"{node!r} sees {other!r} as {','.join(sorted(view.flags))} {view.link}"
        return None

    def _by_id(self, node_id: str) -> DevClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"node {node_id} is not part of this cluster")

    def _current_views(self) -> dict[str, _ClusterView]:
        for node in self.nodes:
            if node.alive:
                return node.views()
        raise RuntimeError("no cluster node is running")

    def primaries(self) -> list[DevClusterNode]:
        """Return the nodes that are primaries now (a dead one only while it still owns slots)."""
        views = self._current_views()
        return [
            node
            for node in self.nodes
            if views[node.node_id].role == "master" and (node.alive or views[node.node_id].slots)
        ]

    def replicas_of(self, primary: DevClusterNode) -> list[DevClusterNode]:
        """Return the nodes that replicate ``primary`` now."""
        views = self._current_views()
        return [n for n in self.nodes if views[n.node_id].master_id == primary.node_id]

    def node_for_slot(self, slot: int) -> DevClusterNode:
        """Return the primary that serves ``slot`` now."""
        for node_id, view in self._current_views().items():
            if view.role == "master" and view.owns(slot):
                return self._by_id(node_id)
        raise LookupError(f"no node serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> DevClusterNode:
        """Return the primary that serves ``key`` now (hash tags respected)."""
        return self.node_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def migrate_slot(
        self,
        slot: int,
        to_node: DevClusterNode,
        timeout: float = TOPOLOGY_TIMEOUT,
        batch: int = 100,
    ) -> None:
        """Move ``slot`` and its keys to primary ``to_node`` (live resharding), wait for agreement.

        IMPORTING on the target, MIGRATING on the source, MIGRATE of the keys in
        batches of ``batch``, then SETSLOT NODE on the target, the source and the
        other primaries, in that order (the order valkey-cli uses).
        """
        source = self.node_for_slot(slot)
        if source is to_node:
            return
        if to_node not in self.primaries():
            raise ValueError(f"{to_node!r} is not a primary")
        to_node.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", to_node.node_id)
        auth = ["AUTH", self.password] if self.password else []
        while keys := source.call("CLUSTER", "GETKEYSINSLOT", slot, batch, decode=False):
            source.call(
                # With tls-cluster, MIGRATE connects over TLS: to the TLS port.
                "MIGRATE", "127.0.0.1", to_node.announced_port, "", 0, 10_000, *auth, "KEYS", *keys,
                decode=False,
            )  # fmt: skip
        others = [n for n in self.primaries() if n not in (to_node, source) and n.alive]
        for node in [to_node, source, *others]:
            node.call("CLUSTER", "SETSLOT", slot, "NODE", to_node.node_id)
        self.wait_stable(timeout)

    def kill(self, node: DevClusterNode, timeout: float = TOPOLOGY_TIMEOUT) -> None:
        """SIGKILL ``node`` and wait until the others flag it as failed.

        A primary with a running replica: also until a replica took over its
        slots and the cluster is ok again. A primary without one leaves the
        cluster down (``cluster_state:fail``).
        """
        views = self._current_views()
        own = views[node.node_id]
        covered = own.role == "slave" or any(
            other.alive and views[other.node_id].master_id == node.node_id for other in self.nodes
        )
        node.kill()
        self.wait_stable(timeout, allow_down=not covered)

    def restart(self, node: DevClusterNode, timeout: float = TOPOLOGY_TIMEOUT) -> None:
        """Start a killed ``node`` again (same port and data dir) and wait until it rejoined.

        A primary that was replaced meanwhile rejoins as a replica of its successor.
        """
        views = self._current_views()
        node.start(timeout)
        down = any(views[n.node_id].slots and not n.alive for n in self.nodes)
        self.wait_stable(timeout, allow_down=down)

    def _processes(self) -> list[DevServer]:
        return list(self.nodes)
