"""What the nodes of every dev topology share: polling, admin calls, teardown."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Required, TypedDict
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from simplebroker_redis.devserver._server import DevServer

#: Seconds between two polls of a topology readiness check.
POLL_INTERVAL: Final[float] = 0.05
#: Default deadline of a topology start, failover or resharding (generous: busy CI hosts).
TOPOLOGY_TIMEOUT: Final[float] = 60.0

#: Key that readiness checks write and delete at once to see replication work.
PROBE_KEY: Final[str] = "__devserver:probe"

#: A readiness check: ``None`` when ready, else what is still missing.
Check = Callable[[], "str | None"]


def wait_for(what: str, check: Check, timeout: float) -> None:
    """Poll ``check`` until it reports ready; else RuntimeError naming ``what`` and why."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            problem = check()
        except (redis.RedisError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g}s: {problem}")
        time.sleep(POLL_INTERVAL)


def pairs(reply: Sequence[Any]) -> dict[str, str]:
    """Return a flat ``[k1, v1, k2, v2, ...]`` reply as a dict."""
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def check_password(password: str | None) -> None:
    """Refuse passwords that would need quoting in a config file or on a command line."""
    if password is not None and (not password or any(c in password for c in " \t\n\"'\\")):
        raise ValueError(
            "dev passwords must be non-empty, without whitespace, quotes or backslashes"
        )


def credentials(password: str | None) -> str:
    """Return the ``:password@`` part of a URL (empty without password)."""
    return f":{quote(password, safe='')}@" if password else ""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files that give the nodes of a dev topology a TLS port.

    Every node presents ``cert_file`` (with ``key_file``) as a server and, on
    replication, cluster-bus and sentinel links, as a client; ``ca_file``
    verifies those peers. Clients need not present a certificate
    (``tls-auth-clients optional``), so a URL with only ``ssl_ca_certs``
    connects, and one with a client certificate does too.
    """

    cert_file: str
    key_file: str
    ca_file: str

    def settings(self) -> list[tuple[str, str]]:
        """Return the server settings (name, value) that load these files."""
        return [
            ("tls-cert-file", self.cert_file),
            ("tls-key-file", self.key_file),
            ("tls-ca-cert-file", self.ca_file),
            ("tls-auth-clients", "optional"),
        ]

    def args(self) -> list[str]:
        """Return :meth:`settings` as server command-line arguments."""
        return [arg for name, value in self.settings() for arg in (f"--{name}", value)]

    @property
    def query(self) -> str:
        """Return the URL query that makes a client verify the nodes (``ssl_ca_certs=...``)."""
        return f"ssl_ca_certs={quote(self.ca_file, safe='/')}"


def tls_args(tls: TlsFiles, tls_port: int) -> list[str]:
    """Return the command line of a data node with a TLS port beside its plain one.

    ``tls-replication yes``: a replica connects to its primary's TLS port and
    announces its own, so sentinels and ROLE name TLS ports. The plain port
    stays open for the dev tools' own admin calls.
    """
    return ["--tls-port", str(tls_port), "--tls-replication", "yes", *tls.args()]


class NodeArgs(TypedDict, total=False):
    """The keyword arguments of :class:`DevNode`, as its subclasses pass them on."""

    data_dir: Required[str]
    port: Required[int]
    password: str | None
    appendonly: bool
    extra_args: Sequence[str]
    binary: str | None
    tls: TlsFiles | None
    tls_port: int | None
    announce_port: int | None


class DevNode(DevServer):
    """A DevServer of a topology: knows whether it runs and talks to it without retries.

    A node with a ``password`` requires it from clients and gives it to its
    primary when it replicates (``requirepass``, ``masterauth``). With
    ``tls`` (and ``tls_port``) it also serves TLS on ``tls_port`` and
    replicates over TLS; admin calls keep using the plain ``port``. With
    ``announce_port`` it names that port to its primary, replicas and
    sentinels instead (``replica-announce-port``): a TCP proxy in front of
    the node (the nemesis suite's) then carries all their traffic to it.
    """

    def __init__(
        self,
        *,
        data_dir: str,
        port: int,
        password: str | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        tls: TlsFiles | None = None,
        tls_port: int | None = None,
        announce_port: int | None = None,
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            port=port,
            appendonly=appendonly,
            extra_args=extra_args,
            binary=binary,
        )
        if (tls is None) != (tls_port is None):
            raise ValueError("a TLS node needs both tls files and a tls_port")
        #: The ``requirepass`` of this node, used by ``call``.
        self.password = password
        #: The certificate files of a TLS node (None: plain TCP only).
        self.tls = tls
        #: The TLS port (None without ``tls``).
        self.tls_port = tls_port
        #: The port this node names to others, when it is not its own (a proxy's).
        self.announce_port = announce_port

    def __repr__(self) -> str:
        return f"{type(self).__name__}(port={self.port})"

    @property
    def announced_port(self) -> int:
        """Return the port this node is known by to clients, replicas and sentinels.

        The ``announce_port`` when it has one; else the TLS port when it has
        one (``tls-replication`` / ``tls-cluster`` make the server name it in
        ROLE, INFO, CLUSTER SLOTS and MOVED to TLS clients), else the plain port.
        """
        if self.announce_port is not None:
            return self.announce_port
        return self.tls_port if self.tls_port is not None else self.port

    def command(self) -> list[str]:
        """Return the server command line, with the password and TLS settings of this node.

        A replica starts its full sync at once (no diskless-sync delay): a
        topology is ready sooner.
        """
        args = [*super().command(), "--repl-diskless-sync-delay", "0"]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if self.tls is not None and self.tls_port is not None:
            args += tls_args(self.tls, self.tls_port)
        if self.announce_port is not None:
            args += ["--replica-announce-ip", "127.0.0.1"]
            args += ["--replica-announce-port", str(self.announce_port)]
        return args

    @property
    def alive(self) -> bool:
        """Return whether the process runs."""
        return self.process is not None and self.process.poll() is None

    def _client(self, decode: bool = True) -> redis.Redis:
        """Return a one-off admin client: no retries, short timeouts, flat RESP2 replies."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            decode_responses=decode,
            protocol=2,  # flat RESP2 replies, whatever redis-py's default protocol is
            socket_timeout=5.0,
            socket_connect_timeout=2.0,
            # Admin commands are polled by the caller: a retry here would only hide
            # a dead node for a few seconds.
            retry=Retry(NoBackoff(), 0),
        )

    def call(self, *args: str | int, decode: bool = True) -> Any:
        """Run one command on this node (fresh connection, no retries, 5 s timeout)."""
        with self._client(decode) as client:
            return client.execute_command(*args)

    def replication_problem(self, probe_key: str, replicas: int) -> str | None:
        """Return why a write on this primary does not reach ``replicas`` replicas yet.

        A replica reports its link up, and its primary lists it, before the
        primary streams writes to it: after a full sync the primary waits for
        the replica's first ACK. A failover in that window lost a write made
        right after ``start()`` (seen on Redis 7.0). So write and delete
        ``probe_key`` and WAIT for both on the same connection.
        """
        with self._client() as client:
            pipe = client.pipeline(transaction=False)
            pipe.set(probe_key, "1")
            pipe.delete(probe_key)
            pipe.wait(replicas, 100)
            acked = int(pipe.execute()[-1])
        if acked < replicas:
            return f"primary {self.port}: {acked} of {replicas} replicas acknowledge writes"
        return None

    def replica_link_problem(self, primary_port: int) -> str | None:
        """Return why this node is not a synced replica of ``primary_port`` (None: it is)."""
        info = self.call("INFO", "replication")
        if info.get("role") != "slave" or int(info.get("master_port", 0)) != primary_port:
            return f"{self.port} is not a replica of {primary_port} yet"
        if info.get("master_link_status") != "up":
            return f"replica {self.port}: link to {primary_port} {info.get('master_link_status')}"
        return None


def kill_all(nodes: Sequence[DevServer]) -> None:
    """SIGKILL every node (its data is thrown away anyway), even if one fails."""
    for node in nodes:
        try:
            node.kill()
        except (OSError, subprocess.SubprocessError):
            pass
