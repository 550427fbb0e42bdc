"""The fork server: ``python -m actorrl.runtime.node.fork_server CONTROL_FD LIFELINE_FD``.

A node spawns one fork server. It imports numpy, torch, gymnasium and actorrl's actor
modules once, freezes the garbage collector's view of those objects, and then forks an
actor process per request, so every actor shares the imported pages with it instead of
importing torch itself (seconds of CPU and ~140 MB private memory per process).

What makes forking safe here: the server is single-threaded and never starts what does not
survive a fork. It creates no ZeroMQ context, no event loop, no torch thread pool (no
parallel op ever runs in it) and never initialises CUDA, so a CUDA learner initialises CUDA
after the fork, in its own process. OpenMP/BLAS pools are kept single-threaded here
(``OMP_NUM_THREADS=1``) and each actor sets torch's thread count from its CPU request.

The messages it exchanges with the node are in :mod:`actorrl.runtime.node.fork_protocol`: a
:class:`~actorrl.runtime.node.fork_protocol.Ready` once imports finish, then per
:class:`~actorrl.runtime.node.fork_protocol.ForkRequest` a ``Forked`` (with the child's pidfd)
or a ``ForkFailed``, and an ``Exited`` when a child is reaped.

The server exits when the node closes its end or when the node's lifeline pipe reports
EOF (the node died). Its children are started with ``PR_SET_PDEATHSIG=SIGKILL``, so they
never outlive it, and they watch the node's lifeline themselves, as spawned actors do.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import NoReturn

from actorrl.runtime.node import fork_protocol as protocol

PRELOAD_MODULES: tuple[str, ...] = (
    "numpy",
    "torch",
    "torch.nn",
    "torch.optim",
    "gymnasium",
    "gymnasium.envs.classic_control",
    "actorrl.runtime.node.actor_main",
    "actorrl.rollout.actor",
    "actorrl.learner.actor",
    "actorrl.replay.actor",
    "actorrl.policy.dqn",
    "actorrl.policy.impala",
    "actorrl.policy.actor_critic",
)
"""What the server imports before its first fork (each best-effort: one that fails to
import is skipped, and the actor that needs it imports it itself)."""

PRELOAD_ENV = "ACTORRL_FORK_PRELOAD"
"""Environment variable replacing :data:`PRELOAD_MODULES`: comma-separated module names
(empty: only the actor entry point), for nodes whose actors need less than an RL stack."""


def preload_modules(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The modules to preload: ``ACTORRL_FORK_PRELOAD``'s list when set (the actor entry
    point always included), else :data:`PRELOAD_MODULES`."""
    listed = environ.get(PRELOAD_ENV)
    if listed is None:
        return PRELOAD_MODULES
    names = [name.strip() for name in listed.split(",") if name.strip()]
    return tuple(dict.fromkeys([*names, "actorrl.runtime.node.actor_main"]))

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def preload(modules: Sequence[str]) -> list[str]:
    """Import ``modules`` (skipping those that fail); returns the ones imported.

    torch's compiler stack (``torch._dynamo``, ~1.5 s of CPU and ~70 MB), which the first
    optimizer a process builds imports, is not in :data:`PRELOAD_MODULES`: only a learner
    builds one, so nodes that host none would pay that at every start. The learner class
    lists it in ``FORK_PRELOAD`` instead (see :func:`preload_for_class`).
    """
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"fork server: not preloading {name}: {exc!r}", file=sys.stderr)
            continue
        loaded.append(name)
    return loaded


def preload_for_class(class_path: str) -> list[str]:
    """Import the modules the actor class ``class_path`` lists in ``FORK_PRELOAD`` and
    that are not loaded yet (once: later forks share them); returns those imported.

    Only a class whose module the server already loaded is asked: the server never
    imports an actor's own code, which might start threads that a fork cannot carry.
    """
    module_name, sep, attr = class_path.partition(":")
    if not sep:
        module_name, _, attr = class_path.rpartition(".")
    owner: object = sys.modules.get(module_name)
    for part in attr.split(".") if owner is not None and attr else ():
        owner = getattr(owner, part, None)
    wanted = [name for name in getattr(owner, "FORK_PRELOAD", ()) if name not in sys.modules]
    if not wanted:
        return []
    loaded = preload(wanted)
    gc.collect()
    gc.freeze()  # as after the first imports: children never write their GC headers
    return loaded


def _set_parent_death_signal(name: str) -> None:
    """Ask the kernel to SIGKILL this process when the thread that forked it exits, and
    name it (``ps -o comm``, ``top``: the command line stays the server's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _reseed_random_generators() -> None:
    """A forked child starts with its parent's RNG states: draw fresh seeds from the OS
    (``random`` reseeds itself after a fork; numpy's and torch's global generators do not)."""
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed(int.from_bytes(os.urandom(4), "little"))
    if "torch" in sys.modules:
        import torch

        torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def _set_torch_threads() -> None:
    """Torch's intra-op thread count from the actor's ``OMP_NUM_THREADS`` (OpenMP read the
    environment when the server loaded it, so setting the variable is not enough)."""
    if "torch" not in sys.modules:
        return
    import torch

    with contextlib.suppress(ValueError, RuntimeError):
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))


def become_actor(server_pid: int, close_fds: Sequence[int], argv: list[str],
                 environ: dict[str, str], log_path: str) -> NoReturn:
    """In a freshly forked child: drop the server's descriptors, point stdio at the log,
    take the actor's environment, and run the actor until it exits (never returns)."""
    code = 1
    try:
        label = os.path.basename(log_path).rsplit(".", 1)[0].rsplit("-", 1)[0]
        _set_parent_death_signal(f"arl:{label}")
        if os.getppid() != server_pid:  # the server died before the signal was armed
            os._exit(3)
        for fd in close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        os.environ.clear()
        os.environ.update(environ)
        gc.enable()
        _reseed_random_generators()
        _set_torch_threads()
        from actorrl.runtime.node import actor_main

        sys.argv = ["actorrl.runtime.node.actor_main", *argv]
        code = actor_main.run(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _log_to(log_path: str) -> None:
    """Point the server's stdout and stderr at ``log_path`` (appending)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        print(f"fork server: cannot log to {log_path}: {exc}", file=sys.stderr, flush=True)
        return
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    print(f"fork server {os.getpid()}: serving a new node of its process", file=sys.stderr,
          flush=True)


class ForkServer:
    """The server's loop: fork on request, reap children, report their exits."""

    def __init__(self, control: socket.socket, lifeline_fd: int) -> None:
        self.control = control
        self.lifeline_fd = lifeline_fd
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, int] = {}
        """pidfd -> pid of each child not yet reaped."""

    def send(self, message: protocol.Message, fds: Sequence[int] = ()) -> None:
        """One message to the node (with descriptors attached, if any)."""
        data = protocol.encode(message)
        if fds:
            socket.send_fds(self.control, [data], list(fds))
        else:
            self.control.send(data)

    def serve(self) -> None:
        """Serve until the node goes away."""
        self.selector.register(self.control, selectors.EVENT_READ, "control")
        self.selector.register(self.lifeline_fd, selectors.EVENT_READ, "lifeline")
        while True:
            for key, _ in self.selector.select():
                if key.data == "control":
                    data = self.control.recv(protocol.MAX_MESSAGE_BYTES)
                    if not data:
                        return
                    try:
                        request = protocol.decode(data)
                    except protocol.ProtocolError as exc:
                        print(f"fork server: {exc}", file=sys.stderr, flush=True)
                        continue
                    if isinstance(request, protocol.ForkRequest):
                        self.handle(request)
                    elif isinstance(request, protocol.LogTo):
                        _log_to(request.log_path)
                    else:
                        print(f"fork server: ignoring {request!r:.100}", file=sys.stderr,
                              flush=True)
                elif key.data == "lifeline":
                    if not os.read(self.lifeline_fd, 1):
                        return
                else:
                    self.reap(key.fd)

    def handle(self, request: protocol.ForkRequest) -> None:
        """Answer one fork request."""
        preload_for_class(request.class_path)
        sys.stdout.flush()
        sys.stderr.flush()
        close_fds = [self.control.fileno(), self.selector.fileno(), *self.children]
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send(protocol.ForkFailed(request.request_id, f"fork failed: {exc}"))
            return
        if pid == 0:
            become_actor(server_pid, close_fds, list(request.argv), dict(request.environ),
                         request.log_path)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        self.send(protocol.Forked(request.request_id, pid), [pidfd])

    def reap(self, pidfd: int) -> None:
        """A child exited: collect its status and tell the node."""
        pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self.send(protocol.Exited(pid, os.waitstatus_to_exitcode(status)))


def main() -> None:
    """Preload, say ready, and serve fork requests until the node goes away."""
    gc.disable()  # no collections while importing: fewer partly-filled pages to copy later
    control_fd, lifeline_fd = int(sys.argv[1]), int(sys.argv[2])
    control = socket.socket(fileno=control_fd)
    started = time.monotonic()
    loaded = preload(preload_modules())
    gc.collect()
    gc.freeze()  # children never write GC headers of the preloaded objects
    server = ForkServer(control, lifeline_fd)
    seconds = round(time.monotonic() - started, 3)
    print(f"fork server {os.getpid()}: preloaded {len(loaded)} modules in {seconds:.2f} s",
          file=sys.stderr, flush=True)
    server.send(protocol.Ready(os.getpid(), loaded, seconds))
    try:
        server.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
