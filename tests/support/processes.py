"""Child processes of a test: workers, schedulers, dashboards.

Each runs in a process group of its own (its pool children too), writes its
output to a file, and is stopped (SIGTERM, as a supervisor does) or killed
(SIGKILL, as a crash does) as a whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from support.waiting import wait_for

#: The ``tests/`` folder: on a child's ``PYTHONPATH`` so that its app can import ``support``.
TESTS = Path(__file__).resolve().parents[1]


def pythonpath(*folders: str | os.PathLike[str]) -> str:
    """Return a child's ``PYTHONPATH``: ``folders`` (its app), ``tests/``, the inherited one."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*(os.fspath(folder) for folder in folders), str(TESTS), inherited])


class Process:
    """One child process group; ``ready`` says when it serves (see :meth:`wait_ready`)."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str],
        out: Path,
        *,
        cwd: str | os.PathLike[str] | None = None,
        ready: Callable[[Process], object] | None = None,
    ) -> None:
        self.out = out
        self._ready = ready
        with out.open("ab") as sink:
            self.process = subprocess.Popen(
                list(args),
                env=env,
                cwd=cwd,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """Return the process ID (also the ID of its group)."""
        return self.process.pid

    def alive(self) -> bool:
        """Return whether the process still runs."""
        return self.process.poll() is None

    def output(self) -> str:
        """Return what the process printed so far."""
        return self.out.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> Self:
        """Wait until ``ready`` holds; fail with the output if the process exits first."""
        ready = self._ready
        assert ready is not None, "this process was started without a readiness check"

        def check() -> object:
            if not self.alive():
                raise AssertionError(
                    f"process {self.pid} exited {self.process.returncode}:\n{self.output()[-6000:]}"
                )
            return ready(self)

        wait_for(check, timeout, f"process {self.pid} to be ready")
        return self

    def signal(self, number: int) -> None:
        """Send signal ``number`` to the whole group (nothing when the process has exited)."""
        if self.alive():
            try:
                os.killpg(self.pid, number)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the whole group and reap the process."""
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM the group (a graceful stop); SIGKILL it if it still runs after ``timeout``."""
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.process.returncode


class Children:
    """The processes a test (or a module) started, with their output files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[Process] = []

    def start(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        ready: Callable[[Process], object] | None = None,
    ) -> Process:
        """Start ``args``; its output goes to ``<folder>/<name>-<n>.out``."""
        out = self.folder / f"{name}-{len(self.started)}.out"
        process = Process(args, env, out, cwd=cwd, ready=ready)
        self.started.append(process)
        return process

    def kill_all(self) -> None:
        """SIGKILL every process still running (the test is over: no graceful drain)."""
        for process in self.started:
            process.kill()

    def stop_all(self) -> None:
        """Stop every process still running, each gracefully first."""
        for process in self.started:
            process.stop()
