"""A node: starts actor processes on this host, watches them and reports their deaths.

The driver of a single-host run hosts a :class:`LocalNode` in its own process. An actor
process says hello to its node (receiving its creation spec), builds the actor, and reports
ready; both steps are acknowledged calls, so nothing depends on messages surviving an exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node.forking import KEPT, ForkServerClient, resolve_start_method
from actorrl.runtime.node.process import ActorProcess, ChildProcess, Lifeline, exit_description
from actorrl.runtime.node.resources import NodeResources
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.runtime import Runtime
from transport.rpc import Request
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT_S = 120.0


@dataclass
class _Running:
    spec: ActorSpec
    process: ActorProcess
    ready: asyncio.Future
    endpoint: str = ""
    stopping: bool = False


def log_label(name: str) -> str:
    """``name`` made safe as part of a log file name: letters, digits, ``_``, ``-`` and
    inner dots only, at most 64 characters (an actor named ``../x`` or ``/etc/x`` must not
    write outside the session's log folder)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64].strip(".")
    return safe or "actor"


class LocalNode(NodeResources):
    """Runs actors as child processes of this process.

    ``num_cpus`` / ``num_gpus`` describe the host for placement; the node records what each
    actor asked for (``used_cpus``) but does not refuse oversubscription on its own host.
    ``on_death(actor_id, reason)`` callbacks fire when an actor process exits unasked.

    ``start_method`` (see :func:`~actorrl.runtime.node.forking.resolve_start_method`): ``fork``
    starts a fork server at once (it imports torch while the caller gets on with its own
    start), or takes over one an earlier node of this process left idle, and forks every
    actor from it; ``spawn`` starts each actor as a fresh interpreter.
    """

    def __init__(self, runtime: Runtime, session_dir: str, num_cpus: float | None = None,
                 num_gpus: float | None = None,
                 child_env: dict[str, str] | None = None,
                 start_method: str | None = None) -> None:
        super().__init__(num_cpus, num_gpus)
        self.runtime = runtime
        self.child_env = dict(child_env or {})
        """Environment every actor process gets (e.g. a cluster node's network)."""
        self.session_dir = session_dir
        self.lifeline = Lifeline()
        self.actors: dict[str, _Running] = {}
        self.on_death: list[Callable[[str, str], None]] = []
        os.makedirs(os.path.join(session_dir, "logs"), exist_ok=True)
        runtime.serve("__actor_hello__", self._on_hello)
        runtime.serve("__actor_ready__", self._on_ready)
        self.start_method = resolve_start_method(start_method)
        self._fork_server: ForkServerClient | None = None
        if self.start_method == "fork":
            self._fork_server = self._start_fork_server()

    @property
    def fork_server(self) -> ForkServerClient | None:
        """The server that forks this node's actor processes (``fork`` start method; None
        with ``spawn``); replaced by a fresh one when it died."""
        return self._fork_server

    def _start_fork_server(self) -> ForkServerClient:
        """A fork server for this node: one this process kept from an earlier node, if
        it matches (:class:`~actorrl.runtime.node.forking.KeptForkServers`), else a new one."""
        log_path = os.path.join(self.session_dir, "logs", "fork-server.log")
        return KEPT.take(log_path, {**os.environ, **self.child_env})

    def _new_process(self, actor_id: str, argv: list[str], env: dict[str, str],
                     log_path: str, class_path: str) -> ActorProcess:
        """Fork (from a fork server, restarted if it died) or spawn the actor's process;
        ``argv`` is completed with the lifeline the process watches."""

        def on_exit(process: ActorProcess) -> None:
            self._on_exit(actor_id, process)

        if self.start_method == "spawn":
            return ChildProcess(["-m", "actorrl.runtime.node.actor_main", *argv,
                                 str(self.lifeline.read_fd)], log_path,
                                self.lifeline, env=env, on_exit=on_exit)
        if self._fork_server is None or not self._fork_server.alive:
            self._fork_server = self._start_fork_server()
        server = self._fork_server
        return server.fork([*argv, str(server.lifeline.read_fd)], {**os.environ, **env},
                           log_path, on_exit, class_path)

    async def start_actor(self, spec: ActorSpec,
                          timeout_s: float = DEFAULT_START_TIMEOUT_S) -> ActorHandle:
        """Start a process for ``spec`` and return its handle once the actor is built."""
        if spec.num_gpus > self.num_gpus - self.used_gpus + 1e-9:
            raise ActorCreationError(
                f"actor {spec.class_path} asks for {spec.num_gpus} GPUs but this node has "
                f"{self.num_gpus - self.used_gpus:g} free; lower num_gpus or add a GPU node")
        actor_id = uuid.uuid4().hex
        label = log_label(spec.name or spec.class_path.rsplit(":", 1)[-1].rsplit(".", 1)[-1])
        log_path = os.path.join(self.session_dir, "logs", f"{label}-{actor_id[:8]}.log")
        env = {**self.child_env, "OMP_NUM_THREADS": str(max(1, int(spec.num_cpus))),
               "MKL_NUM_THREADS": str(max(1, int(spec.num_cpus)))}
        if spec.num_gpus == 0:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU actors never initialise CUDA
        env.update(spec.env)
        ready = asyncio.get_running_loop().create_future()
        # If the caller gave up (cancelled), a late exit still sets an error: consume it.
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        process = self._new_process(
            actor_id, [self.runtime.address, actor_id, self.session_dir], env, log_path,
            spec.class_path)
        running = self.actors[actor_id] = _Running(spec, process, ready)
        try:
            endpoint = await wait_for(asyncio.shield(ready), timeout_s)
            # A forked actor can be ready before this loop reads its server's report of
            # the fork: wait for that too, so the handle's process has its pid.
            await wait_for(asyncio.shield(process.started), timeout_s)
        except BaseException as exc:
            # Given up: a late "ready" is ignored and the exit is no actor's death.
            running.stopping = True
            ready.cancel()
            process.kill()
            if isinstance(exc, TimeoutError):
                raise ActorCreationError(
                    f"actor {spec.class_path} did not start within {timeout_s:g} s",
                    log_path=log_path, log_tail=process.log_tail()) from None
            raise
        self.runtime.forget_dead(endpoint)
        return ActorHandle(actor_id, endpoint, spec.class_path, spec.name, spec, self.runtime)

    def _on_hello(self, request: Request) -> None:
        running = self.actors.get(request.args[0])
        if running is None:
            raise ValueError(f"unknown actor id {request.args[0]!r}")
        spec = running.spec
        request.reply([spec.class_path, list(spec.args), spec.kwargs])

    def _on_ready(self, request: Request) -> None:
        actor_id, endpoint, error = request.args
        request.reply(True)
        running = self.actors.get(actor_id)
        if running is None or running.ready.done():
            return
        running.endpoint = endpoint
        if error is not None:
            running.ready.set_exception(ActorCreationError(
                f"constructing {running.spec.class_path} failed: {error}"))
        else:
            running.ready.set_result(endpoint)

    def _on_exit(self, actor_id: str, process: ActorProcess) -> None:
        running = self.actors.pop(actor_id, None)
        if running is None:
            return
        reason = f"actor process {process.pid} {exit_description(process.returncode)}"
        if not running.ready.done():
            running.ready.set_exception(ActorCreationError(
                f"actor {running.spec.class_path} {reason} while starting",
                log_path=process.log_path, log_tail=process.log_tail()))
            return
        if running.endpoint:
            self.runtime.mark_dead(running.endpoint, reason)
        if not running.stopping:
            log.warning("actor %s (%s) died: %s", actor_id[:8], running.spec.class_path, reason)
            for callback in list(self.on_death):
                callback(actor_id, reason)

    def process_of(self, handle: ActorHandle) -> ActorProcess | None:
        """The child process running ``handle``'s actor, if it runs here."""
        running = self.actors.get(handle.actor_id)
        return running.process if running else None

    async def stop_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Ask the actor to exit, then SIGKILL it if it has not within ``timeout_s``."""
        running = self.actors.get(handle.actor_id)
        if running is None:
            return
        running.stopping = True
        await self._stop(running, timeout_s)

    async def _stop(self, running: _Running, timeout_s: float) -> None:
        process = running.process
        if running.endpoint and process.returncode is None:
            try:
                self.runtime.client(running.endpoint).notify("__exit__")
            except Exception as exc:
                log.debug("could not ask %s to exit: %s", running.endpoint, exc)
        if await process.wait(timeout_s) is None:
            process.kill()
            await process.wait(timeout_s)

    def kill_actor(self, handle: ActorHandle) -> None:
        """SIGKILL the actor's process (it is reported dead, like a crash)."""
        running = self.actors.get(handle.actor_id)
        if running is not None:
            running.process.kill()

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every actor (politely, then by SIGKILL) and reap them all."""
        running = list(self.actors.values())
        for r in running:
            r.stopping = True
        await asyncio.gather(*(self._stop(r, timeout_s) for r in running))
        if self._fork_server is not None:
            await KEPT.give_back(self._fork_server, timeout_s)
        self.lifeline.close()

