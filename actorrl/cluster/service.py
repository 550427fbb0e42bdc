"""The coordinator and node-agent processes: what ``actorrl coordinator start`` and
``actorrl node join`` run, plus the coordinator's state file and daemon mode.

State directory (``--state-dir``, ``$ACTORRL_STATE_DIR`` or ``~/.actorrl``)::

    coordinator.json   pid, address, keys directory of the running coordinator
    coordinator.log    its log (daemon mode)
    jobs/JOB_ID/       one directory per job (see actorrl.cluster.jobs)

``status`` and ``stop`` find the coordinator through ``coordinator.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from actorrl.cluster.jobs import JobManager
from actorrl.runtime.cluster.coordinator import DEFAULT_SESSION_TIMEOUT_S, Coordinator
from actorrl.runtime.cluster.membership import DEFAULT_HEARTBEAT_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from actorrl.runtime.cluster.node_agent import NodeAgent
from actorrl.runtime.network import Network
from actorrl.runtime.process.peers import remove_ipc_fallback
from actorrl.runtime.process.runtime import Runtime
from transport.auth import Security, check_bind
from transport.limits import raise_fd_limit
from transport.rpc import DEFAULT_MAX_PEERS
from transport.sockets import new_event_loop

log = logging.getLogger(__name__)

STATE_FILE = "coordinator.json"
DEFAULT_BIND = "tcp://127.0.0.1:7450"
DEFAULT_MAX_FRAME_MB = 64
"""The largest frame (and message) the coordinator's server socket reads
(``ZMQ_MAXMSGSIZE``; ``--max-frame-mb``). Only control messages come in: node reports,
job submissions, actor creations whose arguments travel inline. Bulk data never does:
the coordinator fetches weights for checkpoints as *replies*, on its client sockets."""



def make_private_dir(path: str) -> None:
    """Create ``path`` (and parents) mode 0700, or tighten an existing one of this user to
    0700: job records, checkpoints, logs and the coordinator's ipc socket are this user's
    alone. A directory of another user (or a symlink in its place) is refused."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory of this user (owner uid "
                              f"{info.st_uid}, or a symlink); use a state directory of your "
                              "own (--state-dir DIR)")
    os.chmod(path, 0o700)

def default_state_dir() -> str:
    """``$ACTORRL_STATE_DIR`` or ``~/.actorrl``."""
    return os.environ.get("ACTORRL_STATE_DIR") or os.path.join(os.path.expanduser("~"),
                                                               ".actorrl")


def read_state(state_dir: str) -> dict[str, Any] | None:
    """The running coordinator's state file, or None."""
    try:
        with open(os.path.join(state_dir, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie we could reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_pid_exit(pid: int, timeout_s: float) -> bool:
    """Block until ``pid`` exits (pidfd, no polling) or ``timeout_s``; True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return bool(ready) or not pid_alive(pid)
    finally:
        os.close(fd)


def _advertise_host(bind: str, advertise: str | None) -> str:
    if advertise:
        return advertise
    host = urlparse(bind).hostname or "127.0.0.1"
    if host in ("0.0.0.0", "*", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return host


def _setup_logging(level: str | None = None) -> None:
    logging.basicConfig(level=level or os.environ.get("ACTORRL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def serve_coordinator(bind: str | None = None, *, keys_dir: str | None = None,
                            state_dir: str | None = None, advertise: str | None = None,
                            heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                            heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                            session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                            on_ready: Callable[[str], None] | None = None,
                            stop: asyncio.Event | None = None,
                            insecure_loopback: bool = False,
                            max_frame_mb: float = DEFAULT_MAX_FRAME_MB,
                            max_peers: int = DEFAULT_MAX_PEERS) -> None:
    """Run a coordinator until ``coord.shutdown``, SIGTERM/SIGINT or ``stop`` is set.

    ``bind`` None: with keys :data:`DEFAULT_BIND` (CURVE tcp on loopback), without keys
    only the ipc socket in the fresh 0700 ``STATE_DIR/run`` folder (this user alone can
    reach it). A tcp ``bind`` needs ``keys_dir``, or on loopback ``insecure_loopback``
    (:func:`transport.auth.check_bind`). ``max_frame_mb``: the largest frame its server
    socket reads (:data:`DEFAULT_MAX_FRAME_MB`); ``max_peers``: open connections past which
    CURVE handshakes are refused (:mod:`transport.rpc`). The soft fd limit is raised to the
    hard one first (:func:`transport.limits.raise_fd_limit`)."""
    raise_fd_limit()
    state_dir = os.path.abspath(state_dir or default_state_dir())
    make_private_dir(state_dir)
    ipc_only = bind is None and not keys_dir
    bind = bind or DEFAULT_BIND
    security = Security.from_dir(keys_dir, "coordinator") if keys_dir else None
    if not ipc_only:
        check_bind(bind, security, insecure_loopback)
    state = read_state(state_dir)
    if state is not None and pid_alive(int(state.get("pid", 0))) and \
            int(state["pid"]) != os.getpid():
        raise RuntimeError(f"a coordinator (pid {state['pid']}) already runs with state "
                           f"directory {state_dir} at {state.get('address')}")
    # An ipc coordinator serves this host only: no tcp side at all.
    host = None if ipc_only or bind.startswith("ipc://") else _advertise_host(bind, advertise)
    network = Network.create(host, f"coord-{uuid.uuid4().hex[:8]}", keys_dir, "coordinator",
                             insecure_loopback=insecure_loopback)
    # Sockets live in the state directory (one coordinator per state directory), so a
    # coordinator killed by SIGKILL leaves nothing in /tmp; the next start clears them.
    session_dir = os.path.join(state_dir, "run")
    shutil.rmtree(session_dir, ignore_errors=True)
    os.makedirs(session_dir, mode=0o700)
    frame_bytes = int(max_frame_mb * 2**20)
    runtime = Runtime.start(session_dir, "coordinator", extra_bind=[] if ipc_only else [bind],
                            network=network, server_options={
                                "max_frame_bytes": frame_bytes,
                                "max_message_bytes": frame_bytes, "max_peers": max_peers})
    address = runtime.local_address if ipc_only else runtime.server.endpoints[-1]
    coordinator = Coordinator(runtime, heartbeat_s, heartbeat_timeout_s, session_timeout_s)
    coordinator.extra_status.append(lambda: {"listen": address, "state_dir": state_dir,
                                             "pid": os.getpid()})
    jobs = JobManager(coordinator, state_dir)
    coordinator.serve()
    jobs.serve()
    coordinator.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    state_path = os.path.join(state_dir, STATE_FILE)
    try:
        resumed = await jobs.resume_all()
        with open(state_path + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "address": address,
                       "bind": address if ipc_only else bind,
                       "keys_dir": os.path.abspath(keys_dir) if keys_dir else None,
                       "state_dir": state_dir, "started_at": time.time()}, f)
        os.replace(state_path + ".tmp", state_path)
        log.info("coordinator listening at %s (state in %s%s)", address, state_dir,
                 f"; resumed jobs {resumed}" if resumed else "")
        if on_ready is not None:
            on_ready(address)
        waiters = [asyncio.ensure_future(stop.wait()),
                   asyncio.ensure_future(coordinator.shutdown_requested.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        log.info("coordinator shutting down")
    finally:
        await jobs.shutdown()
        await coordinator.shutdown(release_nodes=True,
                                   exit_nodes=coordinator.shutdown_with_nodes)
        runtime.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        current = read_state(state_dir)
        if current is not None and current.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.remove(state_path)
        remove_ipc_fallback(session_dir)
        shutil.rmtree(session_dir, ignore_errors=True)


def run_coordinator(bind: str | None = None, *, keys_dir: str | None = None,
                    state_dir: str | None = None, advertise: str | None = None,
                    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                    ready_fd: int | None = None, insecure_loopback: bool = False,
                    max_frame_mb: float = DEFAULT_MAX_FRAME_MB,
                    max_peers: int = DEFAULT_MAX_PEERS) -> int:
    """Blocking entry of the coordinator process; writes ``READY address`` to
    ``ready_fd`` (the daemon handshake) once it serves."""
    _setup_logging()

    def ready(address: str) -> None:
        print(f"coordinator listening at {address}", flush=True)
        if ready_fd is not None:
            os.write(ready_fd, f"READY {address}\n".encode())
            os.close(ready_fd)

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve_coordinator(
            bind, keys_dir=keys_dir, state_dir=state_dir, advertise=advertise,
            heartbeat_timeout_s=heartbeat_timeout_s, session_timeout_s=session_timeout_s,
            on_ready=ready, insecure_loopback=insecure_loopback, max_frame_mb=max_frame_mb,
            max_peers=max_peers))
    except Exception as exc:
        log.error("coordinator failed: %s", exc)
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, f"ERROR {exc}\n".encode())
        return 1
    finally:
        loop.close()
    return 0


def start_daemon(argv: list[str], state_dir: str, timeout_s: float = 60.0) -> str:
    """Start ``python -m actorrl.cli.cluster coordinator start ARGV`` detached (new session,
    output to ``STATE_DIR/coordinator.log``); return its address once it serves."""
    make_private_dir(state_dir)
    read_fd, write_fd = os.pipe()
    log_path = os.path.join(state_dir, "coordinator.log")
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "actorrl.cli.cluster", "coordinator", "start", *argv,
             "--state-dir", state_dir, "--ready-fd", str(write_fd)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,), start_new_session=True, close_fds=True)
    os.close(write_fd)
    try:
        data = b""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(remaining, 0))
            if not ready:
                process.kill()
                raise RuntimeError(f"the coordinator did not start within {timeout_s:g} s; "
                                   f"see {log_path}")
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    line = data.decode(errors="replace").strip()
    if not line.startswith("READY "):
        process.wait(timeout=10)
        raise RuntimeError(f"the coordinator did not start: {line or 'it exited'}; see "
                           f"{log_path}")
    return line.split(" ", 1)[1]


def run_node(address: str, *, name: str | None = None, host: str | None = None,
             num_cpus: float | None = None, num_gpus: float | None = None,
             keys_dir: str | None = None, session_dir: str | None = None,
             insecure_loopback: bool = False, start_method: str | None = None) -> int:
    """Blocking entry of ``actorrl node join``: serve until SIGTERM/SIGINT."""
    _setup_logging()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)

    async def main() -> None:
        agent = NodeAgent(address, name=name, host=host, num_cpus=num_cpus,
                          num_gpus=num_gpus, keys_dir=keys_dir, session_dir=session_dir,
                          insecure_loopback=insecure_loopback, start_method=start_method)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop)

        async def announce() -> None:
            await agent.joined.wait()
            print(f"node {agent.registered_name} joined {address}", flush=True)

        announcer = asyncio.ensure_future(announce())
        try:
            await agent.run()
        finally:
            announcer.cancel()

    try:
        loop.run_until_complete(main())
    except Exception as exc:
        log.error("node agent failed: %s", exc)
        return 1
    finally:
        loop.close()
    return 0
