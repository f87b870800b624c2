"""What a dev cluster and a dev sentinel group share: a temp root, node settings, lifecycle."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Self

from simplebroker_redis.devserver._node import (
    TOPOLOGY_TIMEOUT,
    NodeArgs,
    TlsFiles,
    check_password,
    credentials,
    kill_all,
)
from simplebroker_redis.devserver._server import DevServer, server_binary


class DevTopology:
    """Nodes under one temp dir, built by ``start()`` and all killed by ``stop()``.

    ``kind`` names the URL scheme (``redis+<kind>://``) and the temp dir.
    ``password``, ``appendonly``, ``binary`` and ``tls`` apply to every data
    node. A subclass builds its nodes with :meth:`_node_args` and says how
    to start them (``_build``) and which processes ``stop()`` kills.
    """

    def __init__(
        self,
        kind: str,
        *,
        password: str | None,
        appendonly: bool,
        binary: str | None,
        tls: TlsFiles | None,
    ) -> None:
        check_password(password)
        self.password = password
        #: The certificate files of a TLS topology (None: plain TCP only).
        self.tls = tls
        self._kind = kind
        self._binary = binary or server_binary()
        self._appendonly = appendonly
        self.root = tempfile.mkdtemp(prefix=f"sbredis-{kind}-")

    def _node_args(self, name: str, port: int, tls_port: int | None) -> NodeArgs:
        """Return the arguments of data node ``name`` (its data dir under the root)."""
        return NodeArgs(
            data_dir=os.path.join(self.root, name),
            port=port,
            password=self.password,
            appendonly=self._appendonly,
            binary=self._binary,
            tls=self.tls,
            tls_port=tls_port,
        )

    def _url(self, where: str) -> str:
        """Return the URL of ``where`` (seeds and path), TLS-verified in a TLS topology."""
        if self.tls is None:
            return f"redis+{self._kind}://{credentials(self.password)}{where}"
        return f"rediss+{self._kind}://{credentials(self.password)}{where}?{self.tls.query}"

    def _build(self, timeout: float) -> None:
        raise NotImplementedError

    def _processes(self) -> Sequence[DevServer]:
        raise NotImplementedError

    def start(self, timeout: float = TOPOLOGY_TIMEOUT) -> Self:
        """Start every node and wait until the topology is healthy; on failure stop it all."""
        try:
            self._build(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process and remove the temp dir."""
        kill_all(self._processes())
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
