"""A node's side of its fork server (:mod:`actorrl.runtime.fork_server`): start it, ask it
for actor processes, and learn of their exits.

``ACTORRL_START_METHOD=spawn`` (or ``start_method="spawn"`` on the driver, ``--start-method
spawn`` on the CLI) starts every actor as a fresh interpreter instead; so does a platform
without ``fork``, pidfds or descriptor passing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable

from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.fork_protocol import (
    MAX_MESSAGE_BYTES,
    Exited,
    Forked,
    ForkFailed,
    ForkRequest,
    Message,
    ProtocolError,
    Ready,
    decode,
    encode,
)
from actorrl.runtime.process import ActorProcess, ChildProcess, Lifeline, exit_description

log = logging.getLogger(__name__)

START_METHODS = ("fork", "spawn")
"""How a node starts actor processes: forked from its fork server, or spawned fresh."""


def fork_supported() -> bool:
    """Whether this platform has what the fork server needs (fork, pidfds, fd passing)."""
    return (hasattr(os, "fork") and hasattr(os, "pidfd_open")
            and hasattr(socket, "send_fds") and hasattr(signal, "pidfd_send_signal"))


def resolve_start_method(start_method: str | None = None) -> str:
    """The start method to use: ``start_method``, else ``$ACTORRL_START_METHOD``, else
    ``fork`` where supported; ``fork`` falls back to ``spawn`` where it is not."""
    chosen = start_method or os.environ.get("ACTORRL_START_METHOD") or "fork"
    if chosen not in START_METHODS:
        raise ValueError(f"unknown start method {chosen!r}: use 'fork' (actors forked from "
                         "a fork server that imported torch once) or 'spawn' (a fresh "
                         "interpreter per actor)")
    if chosen == "fork" and not fork_supported():
        log.info("fork server unavailable on this platform; spawning actor processes")
        return "spawn"
    return chosen


class ForkedProcess(ActorProcess):
    """An actor process requested from the fork server. It exists as an object from the
    request on (like a spawned one; ``pid`` is 0 until the fork), gets its pid when the
    server reports the fork, takes
    signals through a pidfd (never a reused pid; a kill sent before the fork is delivered
    on arrival), and gets its exit code from the server, which reaps it."""

    def __init__(self, log_path: str, on_exit: Callable[[ActorProcess], None] | None) -> None:
        super().__init__(0, log_path, on_exit)
        self._pidfd = -1
        self._watching = False
        self._pending_signal: int | None = None

    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` (no-op once the process exited; kept until the fork if it
        has not happened yet)."""
        if self._returncode is not None:
            return
        if self._pidfd < 0:
            self._pending_signal = signum
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signum)

    def _forked_as(self, pid: int, pidfd: int) -> None:
        """The server forked this process."""
        self.pid, self._pidfd = pid, pidfd
        if self._pending_signal is not None:
            self.send_signal(self._pending_signal)

    def _not_forked(self, reason: str) -> None:
        """The server could not fork it (or stopped first): an exit before any start."""
        with contextlib.suppress(OSError), open(self.log_path, "a") as f:
            f.write(f"could not be forked: {reason}\n")
        self._exited_with(255)

    def _reported_exit(self, returncode: int) -> None:
        """The fork server reaped this process."""
        self._close_pidfd()
        self._exited_with(returncode)

    def _watch_orphaned(self) -> None:
        """The fork server died (so the kernel SIGKILLs this process, its child): record
        the exit once the pidfd says the process is gone."""
        if self._returncode is not None or self._pidfd < 0 or self._watching:
            return
        self._watching = True
        self.kill()
        self._loop.add_reader(self._pidfd, self._orphan_gone)

    def _orphan_gone(self) -> None:
        self._close_pidfd()
        self._exited_with(-signal.SIGKILL)

    def _close_pidfd(self) -> None:
        if self._pidfd < 0:
            return
        if self._watching:
            self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1


class ForkServerClient:
    """A node's end of its fork server: starts the server process and turns fork requests
    into :class:`ForkedProcess` objects. Requests sent while the server is still importing
    wait in its socket."""

    def __init__(self, lifeline: Lifeline, log_path: str, env: dict[str, str]) -> None:
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        try:
            self.process = ChildProcess(
                ["-m", "actorrl.runtime.fork_server", str(theirs.fileno()),
                 str(lifeline.read_fd)],
                log_path, lifeline, env=server_env, on_exit=self._server_exited,
                pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        self._socket.setblocking(False)
        self._loop.add_reader(self._socket, self._readable)
        self._request_ids = itertools.count()
        self._pending: dict[int, ForkedProcess] = {}
        self._outbox: collections.deque[bytes] = collections.deque()
        self._children: dict[int, ForkedProcess] = {}
        self.ready: asyncio.Future[float] = self._loop.create_future()
        """Resolves to the server's import time once it can fork."""
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closed = False

    @property
    def alive(self) -> bool:
        """Whether the server can still take requests."""
        return not self.closed and self.process.returncode is None

    def fork(self, argv: list[str], env: dict[str, str], log_path: str,
             on_exit: Callable[[ActorProcess], None] | None) -> ForkedProcess:
        """Ask for a new actor process running ``actor_main`` with ``argv`` and exactly
        the environment ``env``, its output appended to ``log_path``. Returns at once (if
        the server cannot fork it, it exits with code 255 and the reason in its log)."""
        process = ForkedProcess(log_path, on_exit)
        if not self.alive:
            process._not_forked("the fork server is not running")
            return process
        request_id = next(self._request_ids)
        try:
            data = encode(ForkRequest(request_id, argv, env, log_path))
        except ProtocolError as exc:
            process._not_forked(str(exc))
            return process
        self._pending[request_id] = process
        self._outbox.append(data)
        if len(self._outbox) == 1:
            self._flush()
        return process

    def _flush(self) -> None:
        """Send queued requests until the socket is full (then wait until writable)."""
        while self._outbox and not self.closed:
            try:
                self._socket.send(self._outbox[0])
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._socket, self._flush)
                return
            except OSError as exc:
                log.warning("fork server channel failed: %s", exc)
                self._channel_closed()
                return
            self._outbox.popleft()
        self._loop.remove_writer(self._socket)

    def _readable(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._socket, MAX_MESSAGE_BYTES, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("fork server channel failed: %s", exc)
                self._channel_closed()
                return
            if not data:
                self._channel_closed()
                return
            try:
                message = decode(data)
            except ProtocolError as exc:
                log.warning("fork server sent %s", exc)
                message = None
            self._dispatch(message, fds)

    def _dispatch(self, message: Message | None, fds: list[int]) -> None:
        kept = 0
        if isinstance(message, Ready):
            log.debug("fork server %d ready in %.2f s (preloaded %s)", message.pid,
                      message.import_seconds, message.preloaded)
            if not self.ready.done():
                self.ready.set_result(float(message.import_seconds))
        elif isinstance(message, Forked):
            child = self._pending.pop(message.request_id)
            self._children[message.pid] = child
            child._forked_as(message.pid, fds[0])
            kept = 1
        elif isinstance(message, Exited):
            exited = self._children.pop(message.pid, None)
            if exited is not None:
                exited._reported_exit(message.returncode)
        elif isinstance(message, ForkFailed):
            self._pending.pop(message.request_id)._not_forked(
                f"fork server: {message.reason}")
        for fd in fds[kept:]:
            os.close(fd)

    def _channel_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._socket)
        self._loop.remove_writer(self._socket)
        self._socket.close()
        self._outbox.clear()
        error = ActorCreationError("the fork server stopped", log_path=self.process.log_path,
                                   log_tail=self.process.log_tail())
        for process in self._pending.values():
            process._not_forked(str(error))
        self._pending.clear()
        if not self.ready.done():
            self.ready.set_exception(error)
        # Its children die with it (parent-death signal): record each exit when it happens.
        for child in list(self._children.values()):
            child._watch_orphaned()
        self._children.clear()

    def _server_exited(self, process: ActorProcess) -> None:
        if not self.closed:
            log.warning("fork server %d %s", process.pid, exit_description(process.returncode))
        self._channel_closed()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the server (its children should have been stopped first)."""
        self._channel_closed()
        if await self.process.wait(timeout_s) is None:
            self.process.kill()
            await self.process.wait(timeout_s)
