"""Which consumers of a SQLite broker file live: OS file locks beside the file.

A SQLite broker is one machine's file, so the question "does the consumer
holding this message still run?" has an exact answer: each consumer
process holds an exclusive ``flock`` on a file of its own,
``<db>.protean/consumers/<token>.lock``, for as long as it lives. The
kernel drops the lock when the process ends, however it ends (``kill -9``
included), and never while it runs. Another consumer that takes the lock
therefore knows the holder is gone: nothing depends on clocks, leases or
heartbeats, and a stalled-but-living holder is never robbed.

The same files serve as mutexes for copying a stream's log into a group
(``pumps/<hash>.lock``). POSIX only (Linux, macOS): the SQLite mode needs
``fcntl``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class LivenessUnavailable(RuntimeError):
    """The platform has no ``fcntl`` file locks (the SQLite mode needs them)."""


def _try_lock(path: Path, *, create: bool) -> int | None:
    """Return an fd holding an exclusive lock on ``path``, or None when it is taken.

    Raises:
        FileNotFoundError: ``path`` does not exist and ``create`` is False.

    """
    assert fcntl is not None
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class Liveness:
    """The consumer identity of this process, and liveness checks of others."""

    def __init__(self, database: str) -> None:
        if fcntl is None:
            raise LivenessUnavailable(
                "the SimpleBroker provider's SQLite mode needs POSIX file locks (fcntl); "
                "use a Redis URI on this platform"
            )
        self.directory = Path(f"{database}.protean")
        self._consumers = self.directory / "consumers"
        self._pumps = self.directory / "pumps"
        self._guard = threading.Lock()
        self._pid = -1
        self._token = ""
        self._fd: int | None = None

    def token(self) -> str:
        """Return this process's consumer token, locking its file on first use."""
        if self._pid == os.getpid() and self._fd is not None:
            return self._token
        with self._guard:
            if self._pid != os.getpid() or self._fd is None:
                # A forked child shares its parent's lock (one open file
                # description): it needs a token, and a lock, of its own.
                self._consumers.mkdir(parents=True, exist_ok=True)
                token = f"{os.getpid()}x{secrets.token_hex(4)}"
                fd = _try_lock(self._consumers / f"{token}.lock", create=True)
                if fd is None:  # pragma: no cover - a fresh random name
                    raise RuntimeError(f"consumer lock {token} is taken")
                self._token, self._fd, self._pid = token, fd, os.getpid()
            return self._token

    @property
    def active(self) -> bool:
        """Return whether this process has taken a consumer token (and holds its lock)."""
        return self._fd is not None and self._pid == os.getpid()

    @contextlib.contextmanager
    def dead(self, token: str) -> Iterator[bool]:
        """Yield whether consumer ``token`` is gone; while True, nobody else recovers it.

        A gone consumer's lock file is removed when the block ends, so it is
        reported dead once.
        """
        path = self._consumers / f"{token}.lock"
        try:
            fd = _try_lock(path, create=False)
        except FileNotFoundError:
            yield True  # recovered before (or never locked): nothing can hold it
            return
        if fd is None:
            yield False
            return
        try:
            yield True
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def mutex(self, name: str) -> Iterator[bool]:
        """Yield True while holding the process-wide mutex ``name``, False if taken."""
        self._pumps.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
        fd = _try_lock(self._pumps / f"{digest}.lock", create=True)
        if fd is None:
            yield False
            return
        try:
            yield True
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release this process's consumer lock and remove its file."""
        with self._guard:
            fd, self._fd = self._fd, None
            if fd is not None and self._pid == os.getpid():
                with contextlib.suppress(FileNotFoundError):
                    (self._consumers / f"{self._token}.lock").unlink()
                os.close(fd)
