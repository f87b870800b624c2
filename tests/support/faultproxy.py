"""A TCP proxy between clients and a server that can break the network on demand.

``FaultProxy`` listens on a loopback port of its own and forwards every
connection to one upstream server, on an event loop in a thread of the test
process (worker processes connect to its port). Its faults are those of
real networks, as a client sees them:

- :meth:`blackhole`: nothing moves, in one direction or both, and no
  connection is closed or refused: the client's writes sit in socket
  buffers and its reads wait, as behind a dropped route, a NAT table that
  forgot the flow, or a frozen host. New connections are accepted by the
  kernel and then hang like the others (a real blackhole would hang the
  handshake itself: the client's connect timeout is not tested here).
  When it heals, what was held is delivered, as TCP's retransmissions
  deliver it after a partition.
- :meth:`reset`: every open connection is closed with a RST (both sides),
  and with ``refuse`` the listening socket is closed too, so new
  connections are refused until :meth:`heal` (a restarting proxy or load
  balancer, a failover behind a VIP).
- :meth:`latency`: every chunk is held ``seconds`` before it is forwarded,
  as on a long path: chunks read meanwhile are in flight behind it (a delay
  line, not a slower link), so throughput stays what it was.

:meth:`heal` ends every fault. The proxy never changes what it forwards.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, Literal, Self, TypeVar

#: Which way a fault acts: ``to_server`` (requests), ``to_client`` (replies), or both.
Direction = Literal["both", "to_server", "to_client"]

_T = TypeVar("_T")


class _Link:
    """One proxied connection: the client's and the server's streams."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        """Close both sockets with a RST (SO_LINGER 0), not a FIN."""
        for writer in (self.client, self.server):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream``; break the path on demand.

    Args:
        upstream: The server's (host, port).
        port: The port to listen on (default: one the kernel picks).

    """

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        # Set while data may flow that way; cleared by a blackhole.
        self._flowing = {"to_server": asyncio.Event(), "to_client": asyncio.Event()}
        self._delay = 0.0
        self._refusing = False
        #: Connections accepted so far (a test can tell that a client reconnected).
        self.accepted = 0

    # -- life ---------------------------------------------------------------------
    def start(self) -> Self:
        """Start listening (returns once the port accepts connections)."""
        self._thread.start()
        self._call(self._open())
        self.heal()
        return self

    def stop(self) -> None:
        """Close every connection and the listener; stop the thread."""
        self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, scheme: str = "redis", db: int = 0) -> str:
        """Return a URL of the upstream server that goes through the proxy."""
        return f"{scheme}://127.0.0.1:{self.port}/{db}"

    @property
    def connections(self) -> int:
        """Return how many proxied connections are open now."""
        return self._call(self._count())

    # -- faults -------------------------------------------------------------------
    def heal(self) -> None:
        """End every fault: data flows both ways, no delay, new connections accepted."""
        self._call(self._heal())

    def blackhole(self, direction: Direction = "both") -> None:
        """Stop forwarding ``direction`` without closing anything (see the module docstring)."""
        self._call(self._set_flow(direction, flowing=False))

    def reset(self, *, refuse: bool = True) -> None:
        """RST every open connection; with ``refuse``, refuse new ones until :meth:`heal`."""
        self._call(self._reset(refuse))

    def latency(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it (both directions)."""
        self._delay = seconds

    # -- the loop's side ----------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _count(self) -> int:
        return len(self._links)

    async def _open(self) -> None:
        server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(server.sockets[0].getsockname()[1])
        self._server = server

    async def _heal(self) -> None:
        self._delay = 0.0
        for event in self._flowing.values():
            event.set()
        if self._refusing:
            self._refusing = False
            await self._open()

    async def _set_flow(self, direction: Direction, *, flowing: bool) -> None:
        names = ("to_server", "to_client") if direction == "both" else (direction,)
        for name in names:
            event = self._flowing[name]
            event.set() if flowing else event.clear()

    async def _reset(self, refuse: bool) -> None:
        if refuse and not self._refusing:
            self._refusing = True
            assert self._server is not None
            self._server.close()  # the listening socket closes now: ECONNREFUSED
        for link in list(self._links):
            link.reset()
        self._links.clear()

    async def _close_all(self) -> None:
        for link in list(self._links):
            link.reset()
        self._links.clear()
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        to_server: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        to_client: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        link.tasks = [
            asyncio.create_task(self._pump(reader, to_server, "to_server", link)),
            asyncio.create_task(self._deliver(to_server, up_writer, "to_server", link)),
            asyncio.create_task(self._pump(up_reader, to_client, "to_client", link)),
            asyncio.create_task(self._deliver(to_client, writer, "to_client", link)),
        ]

    async def _pump(
        self,
        source: asyncio.StreamReader,
        line: asyncio.Queue[tuple[float, bytes]],
        direction: Literal["to_server", "to_client"],
        link: _Link,
    ) -> None:
        """Read chunks into ``line``, each with the time it is due (b"" at the end)."""
        flowing = self._flowing[direction]
        loop = asyncio.get_running_loop()
        try:
            while True:
                await flowing.wait()  # a blackhole: stop reading, hold what the kernel buffers
                chunk = await source.read(65536)
                line.put_nowait((loop.time() + self._delay, chunk))
                if not chunk:
                    return
        except (OSError, asyncio.CancelledError):
            self._end(link)

    async def _deliver(
        self,
        line: asyncio.Queue[tuple[float, bytes]],
        sink: asyncio.StreamWriter,
        direction: Literal["to_server", "to_client"],
        link: _Link,
    ) -> None:
        """Write each chunk of ``line`` once it is due; end the link at its end."""
        flowing = self._flowing[direction]
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, chunk = await line.get()
                if not chunk:
                    break
                await asyncio.sleep(max(0.0, due - loop.time()))
                await flowing.wait()  # read before the blackhole began: held until it heals
                sink.write(chunk)
                await sink.drain()
        except (OSError, asyncio.CancelledError):
            pass
        self._end(link)

    def _end(self, link: _Link) -> None:
        """One side ended: end the other (a FIN, not a RST)."""
        if link in self._links:
            self._links.discard(link)
            for task in link.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            link.client.close()
            link.server.close()
