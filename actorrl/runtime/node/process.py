"""Watching and reaping actor processes, and starting them as fresh interpreters (spawn).

Forked actor processes (the default on Linux) come from :mod:`actorrl.runtime.node.forking`.

Every child inherits the read end of a *lifeline* pipe whose write end only its parent
holds. When the parent dies, even by SIGKILL, the pipe reports EOF and the child exits, so
no orphan survives its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from transport.timeouts import wait_for


def descendant_pids(pid: int) -> set[int]:
    """Every live process below ``pid``, from ``/proc/<pid>/task/*/children`` recursively
    (Linux; an empty set where /proc has no such files). For measuring a process tree's
    memory and checking that nothing was left behind."""
    found: set[int] = set()
    stack = [pid]
    while stack:
        parent = stack.pop()
        for children_file in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = children_file.read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    return found


class Lifeline:
    """The parent's side of the lifeline pipe: pass ``read_fd`` to children."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()

    def close(self) -> None:
        """Close both ends (children then see EOF and exit)."""
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def watch_lifeline(loop: asyncio.AbstractEventLoop, fd: int, on_parent_death: Callable[[], None]
                   ) -> None:
    """In a child: call ``on_parent_death`` when the lifeline pipe reports EOF."""

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            on_parent_death()

    loop.add_reader(fd, readable)


def exit_description(returncode: int | None) -> str:
    """Human words for a process exit code (``-9`` -> ``killed by SIGKILL``)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ActorProcess:
    """An actor's OS process as its node sees it: its exit reported on the event loop (the
    ``exited`` future and an ``on_exit`` callback), signals, and its log file. Subclasses
    say how it was started and how a signal reaches it."""

    def __init__(self, pid: int, log_path: str,
                 on_exit: Callable[[ActorProcess], None] | None = None) -> None:
        self.pid = pid
        self.log_path = log_path
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self._loop.create_future()
        self.started: asyncio.Future[int] = self._loop.create_future()
        """Resolves to the pid once the process is known to exist (at once for a spawned
        one; a forked one when its server reports the fork), or to 0 if it never started."""
        if pid:
            self.started.set_result(pid)
        self._on_exit = on_exit
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        """The exit code once reaped (negative: killed by that signal), else None."""
        return self._returncode

    def _exited_with(self, returncode: int) -> None:
        """Record the exit (once) and tell whoever waits."""
        if self._returncode is not None:
            return
        self._returncode = returncode
        if not self.started.done():
            self.started.set_result(self.pid)
        if not self.exited.done():
            self.exited.set_result(returncode)
        if self._on_exit is not None:
            self._on_exit(self)

    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` (no-op once the process exited)."""
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL the process (no-op if it already exited)."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM the process (no-op if it already exited)."""
        self.send_signal(signal.SIGTERM)

    async def wait(self, timeout_s: float) -> int | None:
        """Wait for exit up to ``timeout_s``; returns the exit code or None if still alive."""
        try:
            return await wait_for(asyncio.shield(self.exited), timeout_s)
        except TimeoutError:
            return None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last bytes of the process's combined stdout/stderr log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class ChildProcess(ActorProcess):
    """A spawned Python child process (a fresh interpreter) whose exit is reported on the
    event loop through a pidfd."""

    def __init__(self, argv: Sequence[str], log_path: str, lifeline: Lifeline,
                 env: dict[str, str] | None = None,
                 on_exit: Callable[[ActorProcess], None] | None = None,
                 pass_fds: Sequence[int] = ()) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(log_path, "ab") as log_file:
            self.popen = subprocess.Popen(
                [sys.executable, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
                pass_fds=(lifeline.read_fd, *pass_fds),
            )
        super().__init__(self.popen.pid, log_path, on_exit)
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.popen.wait()
        self._exited_with(self.popen.returncode)

    def detach(self) -> None:
        """Stop watching for the exit on this event loop (the process is handed on to
        another loop with :meth:`attach`, e.g. a kept fork server between two runs)."""
        if self._returncode is None:
            self._loop.remove_reader(self._pidfd)

    def stop_detached(self, timeout_s: float) -> None:
        """While detached (no event loop watching it): wait up to ``timeout_s`` for the
        process to exit, SIGKILL it if it has not, and reap it. Blocks."""
        if self._returncode is not None:
            return
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        os.close(self._pidfd)
        self._returncode = self.popen.returncode

    def attach(self, on_exit: Callable[[ActorProcess], None] | None) -> None:
        """Watch for the exit on the running event loop, reporting it to ``on_exit``;
        if the process exited while detached, it is reaped and reported at once."""
        self._loop = asyncio.get_running_loop()
        self._on_exit = on_exit
        if self._returncode is not None:
            return
        self.exited = self._loop.create_future()
        self._loop.add_reader(self._pidfd, self._reap)

    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` (no-op once the process was reaped)."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)
