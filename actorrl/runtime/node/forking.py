"""A node's side of its fork server (:mod:`actorrl.runtime.node.fork_server`): start it, ask it
for actor processes, and learn of their exits.

``ACTORRL_START_METHOD=spawn`` (or ``start_method="spawn"`` on the driver, ``--start-method
spawn`` on the CLI) starts every actor as a fresh interpreter instead; so does a platform
without ``fork``, pidfds or descriptor passing.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable

from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node.fork_protocol import (
    MAX_MESSAGE_BYTES,
    Exited,
    Forked,
    ForkFailed,
    ForkRequest,
    LogTo,
    Message,
    ProtocolError,
    Ready,
    decode,
    encode,
)
from actorrl.runtime.node.process import ActorProcess, ChildProcess, Lifeline, exit_description

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
        if not self.started.done():
            self.started.set_result(pid)
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
        self.lifeline = lifeline
        """The pipe the server and its children watch: they exit when it reports EOF."""
        self.kept_key: tuple = ()
        """What a node must match to take this server over (see :class:`KeptForkServers`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        try:
            self.process = ChildProcess(
                ["-m", "actorrl.runtime.node.fork_server", str(theirs.fileno()),
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

    @property
    def idle(self) -> bool:
        """Alive, with no child running and no request under way (so it can be kept
        for a later node of this process)."""
        return (self.alive and not self._pending and not self._children
                and not self._outbox)

    def detach(self) -> None:
        """Stop serving this event loop (the server must be :attr:`idle`): it is kept,
        unwatched, until :meth:`attach` hands it to another node."""
        self._loop.remove_reader(self._socket)
        self._loop.remove_writer(self._socket)
        self.process.detach()

    def attach(self, log_path: str) -> None:
        """Serve the running event loop (a new node's), with the server's own output
        going to ``log_path`` from now on."""
        self._loop = asyncio.get_running_loop()
        self.process.attach(self._server_exited)
        ready = self.ready
        self.ready = self._loop.create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        if ready.done() and not ready.cancelled() and ready.exception() is None:
            self.ready.set_result(ready.result())
        self.process.log_path = log_path
        self._loop.add_reader(self._socket, self._readable)
        self._outbox.append(encode(LogTo(log_path)))
        self._flush()

    def fork(self, argv: list[str], env: dict[str, str], log_path: str,
             on_exit: Callable[[ActorProcess], None] | None,
             class_path: str = "") -> ForkedProcess:
        """Ask for a new actor process running ``actor_main`` with ``argv`` and exactly
        the environment ``env``, its output appended to ``log_path``, for an actor of
        ``class_path``. Returns at once (if the server cannot fork it, it exits with code
        255 and the reason in its log)."""
        process = ForkedProcess(log_path, on_exit)
        if not self.alive:
            process._not_forked("the fork server is not running")
            return process
        request_id = next(self._request_ids)
        try:
            data = encode(ForkRequest(request_id, argv, env, log_path, class_path))
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

    def stop_detached(self, timeout_s: float = 5.0) -> None:
        """Stop a detached (kept) server: close its channel, so it exits, and reap it
        (SIGKILL after ``timeout_s``). Blocks; for use without an event loop."""
        self.closed = True
        self._socket.close()
        self.process.stop_detached(timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the server (its children should have been stopped first)."""
        self._channel_closed()
        if await self.process.wait(timeout_s) is None:
            self.process.kill()
            await self.process.wait(timeout_s)


KEPT_FORK_SERVERS_ENV = "ACTORRL_KEPT_FORK_SERVERS"
"""Environment variable: how many idle fork servers a process keeps for its next nodes
(default 2; 0 stops each server with its node)."""

KEPT_FORK_SERVERS_IGNORE_ENV = "ACTORRL_KEPT_FORK_SERVERS_IGNORE"
"""Environment variable: comma-separated names of environment variables that may differ
between a kept fork server and a node taking it over, because nothing reads them while the
server imports (a test runner's per-test variable, say). A forked actor gets its whole
environment with its request anyway; every other variable must match."""
_NEVER_MATCHED = frozenset({KEPT_FORK_SERVERS_ENV, KEPT_FORK_SERVERS_IGNORE_ENV})
"""Read by the node, not the server: never part of the match."""


def _ignored_variables(env: dict[str, str]) -> frozenset[str]:
    """The variables left out of the match for a node of environment ``env``."""
    named = env.get(KEPT_FORK_SERVERS_IGNORE_ENV, "")
    return _NEVER_MATCHED | {name.strip() for name in named.split(",") if name.strip()}


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SOURCE_ROOTS = (_PACKAGE_DIR, os.path.join(os.path.dirname(_PACKAGE_DIR), "transport"))
"""The folders of actorrl's and transport's modules (what a fork server imports from this
installation)."""


def source_version() -> tuple[int, int, int]:
    """``(files, total size, newest mtime_ns)`` of the ``.py`` files under
    :data:`_SOURCE_ROOTS`: changes when a module is edited, added or removed, or the
    package is reinstalled, so a server that imported other versions is not taken over."""
    count = size = newest = 0
    for root in _SOURCE_ROOTS:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    try:
                        st = os.stat(os.path.join(folder, name))
                    except OSError:
                        continue
                    count, size = count + 1, size + st.st_size
                    newest = max(newest, st.st_mtime_ns)
    return count, size, newest


class KeptForkServers:
    """The fork servers a process keeps between its nodes.

    A process that runs one training after another (a sweep, a notebook, a test suite)
    would otherwise start a fork server, importing torch again (~2 s of CPU), for each
    node. A node that shuts down hands its server here once every child it forked has
    exited; the next node of the process with the same working directory and
    environment (but the variables named in ``$ACTORRL_KEPT_FORK_SERVERS_IGNORE``), while
    actorrl's module files are unchanged (:func:`source_version`), takes it over (its
    actors get their own environment with each request, as always). Servers started
    through here watch a lifeline of the whole process, not of one node, so a kept server
    and its children still die with the process. At most :attr:`max_kept` idle servers are
    kept, the oldest stopped first.
    """

    def __init__(self, max_kept: int | None = None) -> None:
        self._max_kept = max_kept
        self._kept: collections.OrderedDict[tuple, ForkServerClient] = \
            collections.OrderedDict()
        self._lifeline: Lifeline | None = None
        self._stop_at_exit = False

    @property
    def max_kept(self) -> int:
        """How many idle servers are kept: as constructed, else ``$ACTORRL_KEPT_FORK_SERVERS``
        (default 2)."""
        return self._max_kept if self._max_kept is not None else _kept_from_environment()

    @property
    def lifeline(self) -> Lifeline:
        """This process's lifeline for the servers it starts (made on first use, closed
        only by the process's exit)."""
        if self._lifeline is None:
            self._lifeline = Lifeline()
        return self._lifeline

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def servers(self) -> tuple[ForkServerClient, ...]:
        """The servers kept now, oldest first (for leak checks)."""
        return tuple(self._kept.values())

    def take(self, log_path: str, env: dict[str, str]) -> ForkServerClient:
        """A kept server matching ``env``, the working directory and the version of
        actorrl's modules, now serving the running event loop and logging to ``log_path``;
        else a new one."""
        ignored = _ignored_variables(env)
        key = (source_version(), os.getcwd(),
               tuple(sorted((name, value) for name, value in env.items()
                            if name not in ignored)))
        # Reading max_kept here also refuses a malformed setting when a node starts.
        server = self._kept.pop(key, None) if self.max_kept > 0 else None
        if server is not None:
            if server.process.popen.poll() is None:
                server.attach(log_path)
                return server
            server.stop_detached()  # died while kept
        server = ForkServerClient(self.lifeline, log_path, env)
        server.kept_key = key
        return server

    async def give_back(self, server: ForkServerClient, timeout_s: float = 5.0) -> None:
        """A node is done with ``server``: keep it if it is idle and kept servers are
        wanted, else stop it."""
        if (self.max_kept <= 0 or not server.idle or not server.kept_key
                or server.lifeline is not self._lifeline):
            await server.close(timeout_s)
            return
        server.detach()
        stopped = [self._kept.pop(server.kept_key, None)]
        self._kept[server.kept_key] = server
        while len(self._kept) > self.max_kept:
            stopped.append(self._kept.popitem(last=False)[1])
        for old in filter(None, stopped):  # reaping waits: not on the event loop
            await asyncio.to_thread(old.stop_detached, timeout_s)
        if not self._stop_at_exit:
            atexit.register(self.stop_all)
            self._stop_at_exit = True

    def stop_all(self, timeout_s: float = 5.0) -> None:
        """Stop every kept server and reap it (blocks; run at interpreter exit, and by
        whoever must see no child process left, such as a test suite's leak check)."""
        while self._kept:
            self._kept.popitem()[1].stop_detached(timeout_s)


def _kept_from_environment() -> int:
    value = os.environ.get(KEPT_FORK_SERVERS_ENV, "2")
    try:
        kept = int(value)
    except ValueError:
        kept = -1
    if kept < 0:
        raise ValueError(f"{KEPT_FORK_SERVERS_ENV}={value!r} is not a count: set it to the "
                         "number of idle fork servers a process may keep (0 keeps none)")
    return kept


KEPT = KeptForkServers()
"""This process's kept fork servers."""
