"""The cluster coordinator: node membership, actor placement and actor lifecycles.

Who talks to whom::

    node agent --coord.register_node / coord.heartbeat / coord.actor_died--> coordinator
    coordinator --node.start_actor / node.stop_actor / node.kill_actor-->     node agent
    client     --coord.create_actor / coord.nodes / job.* ...-->              coordinator
    anyone holding a handle or ref --__call__ / __fetch__-->                  the actor itself

Placement: an actor asks for ``num_cpus``/``num_gpus``; the coordinator keeps a ledger of
what every live actor asked for per node and picks, among nodes with room, the one with
the most free CPUs (CPU-only actors avoid nodes with free GPUs when they can). A request
may name a node (hard), prefer one (soft: used when it has room) or ask to sit next to
another actor (``colocate_with``: replay shards next to the learner). When nothing fits it
waits, up to the request's deadline, for a node to join or an actor to exit.

Failure: a node reports the deaths of its actors; a node that misses heartbeats for
``heartbeat_timeout_s`` (or whose control connection drops and does not answer a ping) is
lost, and all its actors are declared dead. Declared deaths fail pending calls at once
(:meth:`Runtime.mark_dead`); owners (jobs) then recreate what they need through
:class:`ClusterDriver`.

Roles (keys carry one, see :mod:`transport.auth`): ``coord.register_node`` /
``heartbeat`` / ``actor_died`` / ``leave`` take node keys (and the coordinator's own);
the client methods take client and admin keys; a client key sees and stops only the actors
of sessions it opened (and of jobs it submitted), an admin key all of them;
``coord.shutdown`` takes an admin key (a client key too while no admin key is on the
allow-list). Connections without CURVE (ipc, keyless loopback) are trusted, as before.
Handlers read who called through :func:`current_caller`.

Nothing here knows about reinforcement learning; jobs are served by a layer above.
"""

from __future__ import annotations

import asyncio
import contextvars
import fnmatch
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from actorrl.runtime.actor import ActorHandle, ActorSpec
from actorrl.runtime.core import Runtime
from actorrl.runtime.driver import ObjectOps
from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node import DEFAULT_START_TIMEOUT_S, LocalNode
from transport.auth import (
    ROLE_ADMIN,
    ROLE_CLIENT,
    ROLE_COORDINATOR,
    ROLE_NODE,
    check_role,
)
from transport.errors import PeerLostError, RemoteError
from transport.rpc import Request, RpcClient
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 0.5
DEFAULT_HEARTBEAT_TIMEOUT_S = 3.0
DEFAULT_SESSION_TIMEOUT_S = 20.0
_EPS = 1e-9


# ---------------------------------------------------------------------------- callers
NODE_ROLES = (ROLE_NODE, ROLE_COORDINATOR)
"""Who may call the node side of ``coord.*`` (register, heartbeat, report deaths, leave)."""
CLIENT_ROLES = (ROLE_CLIENT, ROLE_ADMIN, ROLE_COORDINATOR)
"""Who may call ``job.*`` and the client side of ``coord.*``."""
ADMIN_ROLES = (ROLE_ADMIN, ROLE_COORDINATOR)
"""Who may act on every session and job (and shut the coordinator down)."""
COORDINATOR_ROLES = (ROLE_COORDINATOR,)
"""Who may call ``node.*`` on a node agent: only the coordinator."""


@dataclass(frozen=True)
class Caller:
    """Who made the request being served: the role and z85 public key of its CURVE key,
    both None for a connection without CURVE (trusted: this host's own processes) and for
    calls made in-process."""

    role: str | None = None
    key: str | None = None

    @property
    def is_admin(self) -> bool:
        """Whether this caller may act on every session and job."""
        return self.role is None or self.role in ADMIN_ROLES

    def owns(self, owner_key: str | None) -> bool:
        """Whether this caller may see and stop what was created with key ``owner_key``
        (None: created by a trusted caller, which only admins may touch)."""
        return self.is_admin or (self.role == ROLE_CLIENT and self.key is not None
                                 and owner_key == self.key)


TRUSTED = Caller()
"""The caller outside of any request (in-process calls, a job's own work)."""
_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("actorrl_caller",
                                                                        default=None)


def current_caller() -> Caller:
    """The caller of the request being served (:data:`TRUSTED` outside of one)."""
    return _caller.get() or TRUSTED


def trusted_context() -> contextvars.Context:
    """A copy of the current context with no caller: for tasks that outlive the request
    that started them (a job's run), so they act for nobody in particular."""
    ctx = contextvars.copy_context()
    ctx.run(_caller.set, None)
    return ctx


def serve_guarded(runtime: Runtime, method: str, handler: Callable[[Request], None],
                  roles: Iterable[str] | None = None) -> None:
    """Serve ``method`` with ``handler(request)``, refused (a PermissionError reply naming
    the roles allowed) to a key whose role is not in ``roles`` (None: any role), and run
    with :func:`current_caller` giving the request's caller."""
    allowed = tuple(roles) if roles is not None else None

    def guarded(request: Request) -> None:
        if allowed is not None:
            check_role(request.role, allowed, method)
        token = _caller.set(Caller(request.role, request.key))
        try:
            handler(request)
        finally:
            _caller.reset(token)

    runtime.serve(method, guarded)


# ---------------------------------------------------------------------------- wire helpers
def spec_to_wire(spec: ActorSpec) -> list[Any]:
    """An ActorSpec as codec-serializable fields."""
    return [spec.class_path, list(spec.args), dict(spec.kwargs), spec.num_cpus, spec.num_gpus,
            spec.name, dict(spec.env)]


def spec_from_wire(fields: Sequence[Any]) -> ActorSpec:
    """Rebuild an ActorSpec, checking field types (bad input gets a clear error)."""
    if not isinstance(fields, (list, tuple)) or len(fields) != 7:
        raise ValueError("an actor spec is [class_path, args, kwargs, num_cpus, num_gpus, "
                         "name, env]")
    class_path, args, kwargs, num_cpus, num_gpus, name, env = fields
    if not isinstance(class_path, str) or ":" not in class_path and "." not in class_path:
        raise ValueError(f"class path must look like 'pkg.module:Class', got {class_path!r}")
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise ValueError("actor args must be a list and kwargs a mapping")
    for value, what in ((num_cpus, "num_cpus"), (num_gpus, "num_gpus")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    if not isinstance(name, str) or not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("actor name must be a string and env a mapping of strings")
    return ActorSpec(class_path, tuple(args), dict(kwargs), float(num_cpus), float(num_gpus),
                     name, dict(env))


def serve_async(runtime: Runtime, method: str, fn: Callable[..., Awaitable[Any]],
                roles: Iterable[str] | None = None) -> None:
    """Serve ``method`` with coroutine function ``fn(*args, **kwargs)``; its return value is
    the reply, its exception the error reply. Wrong arguments fail at once. ``roles``: the
    key roles allowed to call it (None: any; see :func:`serve_guarded`); ``fn`` sees the
    caller through :func:`current_caller`."""
    tasks: set[asyncio.Task] = set()

    def handler(request: Request) -> None:
        task = runtime.loop.create_task(fn(*request.args, **request.kwargs))
        tasks.add(task)

        def done(t: asyncio.Task) -> None:
            tasks.discard(t)
            if t.cancelled():
                request.fail(RuntimeError(f"{method} was cancelled (shutting down)"))
            elif t.exception() is not None:
                request.fail(t.exception())
            else:
                request.reply(t.result())

        task.add_done_callback(done)

    serve_guarded(runtime, method, handler, roles)


# ---------------------------------------------------------------------------- nodes
LEFT = "it left"
"""The reason recorded for a node that left (``coord.leave``), as opposed to one lost."""
MAX_REASON_CHARS = 2_000
"""A reported death reason is kept at most this long (a peer chooses its size)."""
MAX_EARLY_DEATHS = 1_000
"""Deaths of actors whose start was not answered yet, kept until it is."""

class NodeConnection(Protocol):
    """How the coordinator starts and stops actors on one node."""

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        """Start an actor; returns ``(actor_id, endpoint, pid)``."""
        ...

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        """Ask an actor to exit, SIGKILL after ``timeout_s``."""
        ...

    async def kill_actor(self, actor_id: str) -> None:
        """SIGKILL an actor (it is reported dead, like a crash)."""
        ...

    async def release(self, exit_node: bool) -> None:
        """Stop every actor of the node (and make the agent exit when ``exit_node``)."""
        ...

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        """The end of an actor process's output (stdout + stderr)."""
        ...

    def close(self) -> None:
        """Drop the connection."""
        ...


class RemoteNode:
    """A node agent in another process, reached over its control connection."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        try:
            actor_id, endpoint, pid = await self.client.call(
                "node.start_actor", [spec_to_wire(spec), timeout_s], timeout_s=timeout_s + 5)
        except ActorCreationError as exc:  # the node refused: its message says why
            if isinstance(exc, RemoteError):  # (the node's own traceback is noise)
                raise ActorCreationError(exc.message) from None
            raise
        return actor_id, endpoint, pid

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        await self.client.call("node.stop_actor", [actor_id, timeout_s],
                               timeout_s=timeout_s * 2 + 5)

    async def kill_actor(self, actor_id: str) -> None:
        await self.client.call("node.kill_actor", [actor_id], timeout_s=10)

    async def release(self, exit_node: bool) -> None:
        await self.client.call("node.release", [exit_node], timeout_s=30)

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        return await self.client.call("node.actor_log", [actor_id, max_bytes], timeout_s=10)

    def close(self) -> None:
        self.client.close()


class InProcessNode:
    """A :class:`LocalNode` in the coordinator's own process (``Client.local()``)."""

    def __init__(self, local: LocalNode) -> None:
        self.local = local

    async def start_actor(self, spec: ActorSpec, timeout_s: float) -> tuple[str, str, int]:
        handle = await self.local.start_actor(spec, timeout_s)
        process = self.local.process_of(handle)
        return handle.actor_id, handle.endpoint, process.pid if process else 0

    async def stop_actor(self, actor_id: str, timeout_s: float) -> None:
        await self.local.stop_actor(ActorHandle(actor_id, ""), timeout_s)

    async def kill_actor(self, actor_id: str) -> None:
        self.local.kill_actor(ActorHandle(actor_id, ""))

    async def release(self, exit_node: bool) -> None:
        await asyncio.gather(*(self.local.stop_actor(ActorHandle(a, ""))
                               for a in list(self.local.actors)))

    async def actor_log(self, actor_id: str, max_bytes: int) -> str:
        process = self.local.process_of(ActorHandle(actor_id, ""))
        return process.log_tail(max_bytes) if process is not None else ""

    def close(self) -> None:
        pass


@dataclass
class NodeState:
    """One member node and its resource ledger."""

    node_id: str
    name: str
    endpoint: str
    host: str
    num_cpus: float
    num_gpus: float
    conn: NodeConnection
    seq: int
    used_cpus: float = 0.0
    used_gpus: float = 0.0
    alive: bool = True
    last_heartbeat: float = field(default_factory=time.monotonic)
    joined_at: float = field(default_factory=time.time)
    actor_ids: set[str] = field(default_factory=set)
    probing: bool = False
    starting: int = 0
    """Actor starts asked of this node and not answered yet."""

    @property
    def free_cpus(self) -> float:
        """CPUs not asked for by live actors."""
        return self.num_cpus - self.used_cpus

    @property
    def free_gpus(self) -> float:
        """GPUs not asked for by live actors."""
        return self.num_gpus - self.used_gpus

    def fits(self, spec: ActorSpec) -> bool:
        """Whether ``spec``'s request fits in what is free."""
        return (spec.num_cpus <= self.free_cpus + _EPS
                and spec.num_gpus <= self.free_gpus + _EPS)

    def describe(self) -> dict[str, Any]:
        """A summary for ``nodes()`` / status."""
        return {"node_id": self.node_id, "name": self.name, "host": self.host,
                "endpoint": self.endpoint, "num_cpus": self.num_cpus,
                "num_gpus": self.num_gpus, "used_cpus": self.used_cpus,
                "used_gpus": self.used_gpus, "num_actors": len(self.actor_ids),
                "alive": self.alive, "joined_at": self.joined_at}


@dataclass
class ActorRecord:
    """The coordinator's record of one actor."""

    actor_id: str
    spec: ActorSpec
    node_id: str
    owner: str
    endpoint: str
    pid: int
    state: str = "alive"
    """``alive``, ``stopping``, ``dead`` (crashed or its node was lost) or ``stopped``."""
    reason: str = ""

    def handle(self, runtime: Runtime) -> ActorHandle:
        """A handle that can restart the actor (carries its spec), calling it through
        ``runtime``."""
        return ActorHandle(self.actor_id, self.endpoint, self.spec.class_path, self.spec.name,
                           self.spec, runtime)

    def describe(self, node_name: str) -> dict[str, Any]:
        """A summary for ``actors()``."""
        return {"actor_id": self.actor_id, "name": self.spec.name,
                "class_path": self.spec.class_path, "node_id": self.node_id,
                "node": node_name, "owner": self.owner, "endpoint": self.endpoint,
                "pid": self.pid, "state": self.state, "reason": self.reason,
                "num_cpus": self.spec.num_cpus, "num_gpus": self.spec.num_gpus}


# ---------------------------------------------------------------------------- coordinator
class Coordinator:
    """Membership, placement and actor lifecycles for a cluster, served on ``runtime``.

    Call :meth:`serve` to expose the ``coord.*`` methods, :meth:`start` to begin heartbeat
    monitoring, :meth:`shutdown` to stop every actor and release the nodes.
    """

    def __init__(self, runtime: Runtime, heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> None:
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.session_timeout_s = session_timeout_s
        self.sessions: dict[str, float] = {}
        """Client sessions owning actors -> when they last pinged (monotonic)."""
        self.owner_keys: dict[str, str | None] = {}
        """Owner (``client:SESSION``, ``job:ID``) -> the public key that created it (None:
        a trusted caller); a client key may act only on owners created with it."""
        self.nodes: dict[str, NodeState] = {}
        self.actors: dict[str, ActorRecord] = {}
        self.lost_nodes: deque[dict[str, Any]] = deque(maxlen=100)
        self.on_actor_died: list[Callable[[ActorRecord], None]] = []
        self.on_node_lost: list[Callable[[NodeState, str], None]] = []
        self.shutdown_requested = asyncio.Event()
        self.shutdown_with_nodes = False
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self._early_deaths: dict[str, str] = {}
        self._monitor: asyncio.Task | None = None
        self._closing = False
        self._tasks: set[asyncio.Task] = set()
        self.extra_status: list[Callable[[], dict[str, Any]]] = []

    @property
    def early_deaths(self) -> Mapping[str, str]:
        """Deaths reported for actors whose start is still in flight (bounded), by actor
        id: the start then fails with that reason."""
        return MappingProxyType(self._early_deaths)

    # ---- lifecycle ----------------------------------------------------------------------
    def serve(self) -> None:
        """Serve the ``coord.*`` protocol on the runtime."""
        rt = self.runtime
        for name, fn, roles in (
                ("coord.register_node", self._rpc_register_node, NODE_ROLES),
                ("coord.leave", self._rpc_leave, NODE_ROLES),
                ("coord.actor_died", self._rpc_actor_died, NODE_ROLES),
                ("coord.create_actor", self._rpc_create_actor, CLIENT_ROLES),
                ("coord.kill_actor", self._rpc_kill_actor, CLIENT_ROLES),
                ("coord.close_session", self._rpc_close_session, CLIENT_ROLES),
                ("coord.wait_nodes", self._rpc_wait_nodes, CLIENT_ROLES),
                ("coord.wait_actor", self._rpc_wait_actor, CLIENT_ROLES),
                ("coord.actor_log", self._rpc_actor_log, CLIENT_ROLES),
                ("coord.shutdown", self._rpc_shutdown, CLIENT_ROLES)):
            serve_async(rt, name, fn, roles)
        serve_guarded(rt, "coord.heartbeat", self._on_heartbeat, NODE_ROLES)
        serve_guarded(rt, "coord.session_ping", self._on_session_ping, CLIENT_ROLES)
        serve_guarded(rt, "coord.hello", lambda r: r.reply({
            "address": rt.address, "max_frame_bytes": rt.server.max_frame_bytes}))
        serve_guarded(rt, "coord.nodes", lambda r: r.reply(self.describe_nodes()),
                      CLIENT_ROLES)
        serve_guarded(rt, "coord.actors", lambda r: r.reply(self.describe_actors(
            *r.args, caller=current_caller())), CLIENT_ROLES)
        serve_guarded(rt, "coord.status", lambda r: r.reply(self.status()), CLIENT_ROLES)

    def start(self) -> None:
        """Start watching heartbeats."""
        if self._monitor is None:
            self._monitor = self.runtime.loop.create_task(self._watch_heartbeats())

    async def shutdown(self, release_nodes: bool = True, exit_nodes: bool = False) -> None:
        """Stop monitoring; stop every actor; release (or shut down) every node."""
        self._closing = True
        if self._monitor is not None:
            self._monitor.cancel()
        tasks = [t for t in (self._monitor, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        nodes = [n for n in self.nodes.values() if n.alive]
        if release_nodes:
            results = await asyncio.gather(*(n.conn.release(exit_nodes) for n in nodes),
                                           return_exceptions=True)
            for node, result in zip(nodes, results):
                # A node told to exit may close before its reply leaves: that is success.
                if isinstance(result, BaseException) and not (
                        exit_nodes and isinstance(result, PeerLostError)):
                    log.warning("could not release node %s: %s", node.name, result)
        for node in nodes:
            node.conn.close()
        self.nodes.clear()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout_s: float) -> None:
        event = self._changed
        try:
            await wait_for(event.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            pass

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- membership ---------------------------------------------------------------------
    def add_node(self, node_id: str, name: str, endpoint: str, host: str, num_cpus: float,
                 num_gpus: float, conn: NodeConnection) -> NodeState:
        """Add a member (idempotent per ``node_id``); names are made unique."""
        existing = self.nodes.get(node_id)
        if existing is not None:
            existing.last_heartbeat = time.monotonic()
            return existing
        taken = {n.name for n in self.nodes.values()}
        unique, i = name, 2
        while unique in taken:
            unique, i = f"{name}-{i}", i + 1
        node = NodeState(node_id, unique, endpoint, host, float(num_cpus), float(num_gpus),
                         conn, next(self._seq))
        self.nodes[node_id] = node
        log.info("node %s joined: %g cpus, %g gpus at %s", unique, num_cpus, num_gpus, host)
        self._notify()
        return node

    def add_local_node(self, local: LocalNode, name: str = "local") -> NodeState:
        """Make an in-process :class:`LocalNode` a member (no heartbeats needed)."""
        node = self.add_node(f"local-{id(local):x}", name, self.runtime.address, "localhost",
                             local.num_cpus, local.num_gpus, InProcessNode(local))
        local.on_death.append(lambda actor_id, reason: self.actor_died(actor_id, reason))
        return node

    def node_lost(self, node: NodeState, reason: str) -> None:
        """Declare ``node`` lost: every actor on it is dead."""
        if not node.alive or self._closing:
            return
        node.alive = False
        self.nodes.pop(node.node_id, None)
        if reason == LEFT:
            log.info("node %s left the cluster", node.name)
        else:
            log.warning("node %s lost: %s", node.name, reason)
        self.lost_nodes.append({**node.describe(), "reason": reason, "lost_at": time.time()})
        for actor_id in list(node.actor_ids):
            self.actor_died(actor_id, f"its node {node.name} was lost ({reason})")
        node.conn.close()
        for callback in list(self.on_node_lost):
            callback(node, reason)
        self._notify()

    def _suspect(self, node: NodeState, why: str) -> None:
        """The control connection dropped or a call failed: ping once, lose it if silent."""
        if not node.alive or node.probing or self._closing or isinstance(node.conn,
                                                                         InProcessNode):
            return
        node.probing = True

        async def probe() -> None:
            client = self.runtime.connect(node.endpoint, connect_timeout_s=1.5)
            try:
                await client.call("__ping__", timeout_s=1.5)
            except Exception as exc:
                self.node_lost(node, f"{why}; ping failed: {exc}")
            finally:
                client.close()
                node.probing = False

        self._spawn(probe())

    async def _watch_heartbeats(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.heartbeat_s)
            now = time.monotonic()
            stall = now - last - self.heartbeat_s
            last = now
            if stall > self.heartbeat_s:
                # This loop was held up (a saturated machine: 256 actor processes starting
                # on 2 cores held it ~3 s): the heartbeats that came meanwhile wait unread
                # in the socket, and every node would be declared lost at once. The time
                # the coordinator could not listen is not the nodes' silence.
                for node in self.nodes.values():
                    node.last_heartbeat += stall
            for node in list(self.nodes.values()):
                if isinstance(node.conn, InProcessNode):
                    continue
                if now - node.last_heartbeat > self.heartbeat_timeout_s:
                    self.node_lost(node, f"no heartbeat for {now - node.last_heartbeat:.1f} s")
            for session, last in list(self.sessions.items()):
                if now - last > self.session_timeout_s:
                    # The client went away without closing: its actors go too.
                    del self.sessions[session]
                    log.warning("client session %s silent for %.0f s; stopping its actors",
                                session[:8], now - last)
                    self._spawn(self._end_session(session))

    async def _end_session(self, session: str) -> int:
        """Stop a session's actors and forget it (and who owned it)."""
        self.sessions.pop(session, None)
        try:
            return await self.kill_owner(f"client:{session}")
        finally:
            if session not in self.sessions:  # (not reopened meanwhile)
                self.owner_keys.pop(f"client:{session}", None)

    def _check_session(self, session: str) -> None:
        """PermissionError unless the caller may act for ``session`` (it is new, or was
        opened with the caller's key, or the caller is an admin)."""
        owner = f"client:{session}"
        if owner in self.owner_keys and not current_caller().owns(self.owner_keys[owner]):
            raise PermissionError(
                f"session {session[:8]}... was opened with another client key; a client key "
                "may only use its own sessions (use a fresh session id, or an admin key)")

    def _check_actor(self, actor_id: str) -> None:
        """PermissionError unless the caller may see and stop actor ``actor_id`` (an
        unknown actor passes: the caller then gets what an unknown actor gets)."""
        record = self.actors.get(actor_id) if isinstance(actor_id, str) else None
        if record is not None and not current_caller().owns(
                self.owner_keys.get(record.owner)):
            raise PermissionError(
                f"actor {actor_id[:8]} belongs to a session or job of another key; a client "
                "key may only stop or read the actors of its own sessions and jobs (an admin "
                "key may act on all)")

    def _on_session_ping(self, request: Request) -> None:
        session = request.args[0] if request.args else None
        known = isinstance(session, str) and session in self.sessions and \
            current_caller().owns(self.owner_keys.get(f"client:{session}"))
        if known:
            self.sessions[session] = time.monotonic()
        request.reply({"known": known})

    async def _rpc_register_node(self, node_id: str, name: str, endpoint: str, host: str,
                                 num_cpus: float, num_gpus: float) -> dict[str, Any]:
        if not all(isinstance(v, str) and v for v in (node_id, name, endpoint, host)):
            raise ValueError("node_id, name, endpoint and host must be non-empty strings")
        for value in (num_cpus, num_gpus):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"node resources must be numbers >= 0, got {value!r}")
        node = self.nodes.get(node_id)
        if node is None:
            client = self.runtime.connect(endpoint, connect_timeout_s=10)
            node = self.add_node(node_id, name, endpoint, host, num_cpus, num_gpus,
                                 RemoteNode(client))
            client.on_lost.append(lambda exc, n=node: self._suspect(n, str(exc)))
        node.last_heartbeat = time.monotonic()
        return {"name": node.name, "heartbeat_s": self.heartbeat_s,
                "heartbeat_timeout_s": self.heartbeat_timeout_s}

    def _on_heartbeat(self, request: Request) -> None:
        node = self.nodes.get(request.args[0]) if request.args else None
        if node is not None:
            node.last_heartbeat = time.monotonic()
        request.reply({"known": node is not None})

    async def _rpc_leave(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is not None:
            self.node_lost(node, LEFT)
        return True

    async def _rpc_wait_nodes(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + min(float(timeout_s), 300.0)
        while len(self.nodes) < count and time.monotonic() < deadline:
            await self._wait_change(deadline - time.monotonic())
        return len(self.nodes)

    async def _rpc_wait_actor(self, name: str, owner: str | None = None,
                              exclude: Sequence[str] = (), timeout_s: float = 30.0
                              ) -> dict[str, Any] | None:
        """Long-poll: the first live actor called ``name`` (of ``owner``) whose id is not in
        ``exclude`` (e.g. the replacement of a killed one), or None after ``timeout_s``."""
        if not isinstance(name, str) or not (owner is None or isinstance(owner, str)) \
                or not isinstance(exclude, list | tuple) \
                or not all(isinstance(e, str) for e in exclude) \
                or isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
            raise TypeError("coord.wait_actor takes (name: str, owner: str | None, "
                            "exclude: list[str], timeout_s: number)")
        deadline = time.monotonic() + min(float(timeout_s), 300.0)
        caller = current_caller()
        while True:
            for record in self.actors.values():
                if record.spec.name == name and record.state == "alive" and \
                        record.actor_id not in exclude and owner in (None, record.owner) \
                        and caller.owns(self.owner_keys.get(record.owner)):
                    node = self.nodes.get(record.node_id)
                    return record.describe(node.name if node else "?")
            if time.monotonic() >= deadline:
                return None
            await self._wait_change(deadline - time.monotonic())

    # ---- placement ----------------------------------------------------------------------
    def _find_node(self, name_or_id: str) -> NodeState | None:
        for node in self.nodes.values():
            if name_or_id in (node.node_id, node.name):
                return node
        return None

    def choose_node(self, spec: ActorSpec, node: str | None = None, prefer: str | None = None,
                    colocate_with: str | None = None,
                    exclude: set[str] | frozenset[str] = frozenset()) -> NodeState | None:
        """The node for ``spec``, or None when none has room now."""
        candidates = [n for n in self.nodes.values() if n.alive and n.node_id not in exclude]
        if node is not None:
            target = self._find_node(node)
            return target if target in candidates and target.fits(spec) else None
        anchor = self.actors.get(colocate_with) if colocate_with else None
        if anchor is not None and anchor.state == "alive":
            target = self.nodes.get(anchor.node_id)
            if target in candidates and target.fits(spec):
                return target
        if prefer is not None:
            target = self._find_node(prefer)
            if target in candidates and target.fits(spec):
                return target
        fitting = [n for n in candidates if n.fits(spec)]
        if not fitting:
            return None

        now = time.monotonic()

        def key(n: NodeState) -> tuple:
            # A node that missed its last heartbeats may be dying (its actors just died
            # with it): others first, so a replacement does not try it and time out.
            responsive = isinstance(n.conn, InProcessNode) or \
                now - n.last_heartbeat <= 2 * self.heartbeat_s
            keeps_gpus_free = spec.num_gpus > 0 or n.free_gpus <= _EPS
            return (responsive, keeps_gpus_free, n.free_cpus, -n.seq)

        return max(fitting, key=key)

    def _no_room_message(self, spec: ActorSpec, node: str | None) -> str:
        what = f"{spec.num_cpus:g} CPUs and {spec.num_gpus:g} GPUs"
        if not self.nodes:
            return f"no node has joined the cluster to run {spec.name or spec.class_path}"
        free = ", ".join(f"{n.name}: {n.free_cpus:g} CPUs/{n.free_gpus:g} GPUs free"
                         for n in self.nodes.values())
        where = f"node {node!r}" if node else "no node"
        return (f"{where} has room for {spec.name or spec.class_path} ({what}); {free}. "
                "Add a node (`actorrl node join`) or lower the request.")

    async def create_actor(self, spec: ActorSpec, owner: str, *, node: str | None = None,
                           prefer: str | None = None, colocate_with: str | None = None,
                           timeout_s: float = DEFAULT_START_TIMEOUT_S) -> ActorHandle:
        """Place and start an actor for ``owner``; waits for room up to ``timeout_s``.

        ``node`` (name or id) is a hard choice; ``prefer`` a soft one; ``colocate_with``
        (an actor id) puts it on that actor's node when there is room.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        failed_nodes: set[str] = set()
        while True:
            target = self.choose_node(spec, node, prefer, colocate_with, failed_nodes)
            if target is None:
                if node is not None and self._find_node(node) is None and not any(
                        n.node_id in failed_nodes for n in self.nodes.values()):
                    known = ", ".join(sorted(n.name for n in self.nodes.values())) or "none"
                    raise ActorCreationError(f"no node named {node!r} (nodes: {known})")
                if loop.time() >= deadline:
                    raise ActorCreationError(self._no_room_message(spec, node))
                if failed_nodes and not [n for n in self.nodes.values()
                                         if n.node_id not in failed_nodes]:
                    failed_nodes.clear()  # the survivors may have recovered by now
                await self._wait_change(min(deadline - loop.time(), 1.0))
                continue
            target.used_cpus += spec.num_cpus
            target.used_gpus += spec.num_gpus
            target.starting += 1
            try:
                actor_id, endpoint, pid = await target.conn.start_actor(
                    spec, max(deadline - loop.time(), 1.0))
            except ActorCreationError:
                self._release(target, spec)
                raise
            except Exception as exc:  # the node failed, not the actor: try another
                self._release(target, spec)
                log.warning("starting %s on node %s failed: %s", spec.name or spec.class_path,
                            target.name, exc)
                failed_nodes.add(target.node_id)
                self._suspect(target, f"start_actor failed: {exc}")
                continue
            finally:
                target.starting -= 1
            record = ActorRecord(actor_id, spec, target.node_id, owner, endpoint, pid)
            self.actors[actor_id] = record
            target.actor_ids.add(actor_id)
            early = self._early_deaths.pop(actor_id, None)
            if early is not None or not target.alive:
                self.actor_died(actor_id, early or f"its node {target.name} was lost")
            self.runtime.forget_dead(endpoint)
            log.info("started %s (%s) on node %s", spec.name or spec.class_path,
                     actor_id[:8], target.name)
            self._notify()
            return record.handle(self.runtime)

    def _release(self, node: NodeState, spec: ActorSpec) -> None:
        node.used_cpus = max(0.0, node.used_cpus - spec.num_cpus)
        node.used_gpus = max(0.0, node.used_gpus - spec.num_gpus)
        self._notify()

    def _retire(self, record: ActorRecord, state: str, reason: str) -> None:
        if record.state in ("dead", "stopped"):
            return
        record.state, record.reason = state, reason
        node = self.nodes.get(record.node_id)
        if node is not None:
            node.actor_ids.discard(record.actor_id)
            self._release(node, record.spec)
        self.runtime.mark_dead(record.endpoint, reason)
        self.actors.pop(record.actor_id, None)

    def actor_died(self, actor_id: str, reason: str) -> None:
        """An actor's process exited unasked (reported by its node or its node was lost)."""
        reason = reason[:MAX_REASON_CHARS]
        record = self.actors.get(actor_id)
        if record is None:  # died before its start was answered: kept (bounded) until then
            self._early_deaths[actor_id] = reason
            while len(self._early_deaths) > MAX_EARLY_DEATHS:
                self._early_deaths.pop(next(iter(self._early_deaths)))
            return
        if record.state in ("dead", "stopped"):
            return
        stopping = record.state == "stopping"
        self._retire(record, "stopped" if stopping else "dead", reason)
        if not stopping:
            log.warning("actor %s (%s) of %s died: %s", record.spec.name or
                        record.spec.class_path, actor_id[:8], record.owner, reason)
            for callback in list(self.on_actor_died):
                callback(record)

    async def kill_actor(self, actor_id: str, timeout_s: float = 5.0) -> None:
        """Stop an actor (exit request, SIGKILL after ``timeout_s``) and free its room."""
        record = self.actors.get(actor_id)
        if record is None or record.state != "alive":
            return
        record.state = "stopping"
        node = self.nodes.get(record.node_id)
        if node is not None and node.alive:
            try:
                await node.conn.stop_actor(actor_id, timeout_s)
            except Exception as exc:
                log.debug("stopping %s: %s", actor_id[:8], exc)
        self._retire(record, "stopped", "stopped")

    async def sigkill_actor(self, actor_id: str) -> None:
        """SIGKILL an actor's process, as a crash (tests, fault injection)."""
        record = self.actors.get(actor_id)
        node = self.nodes.get(record.node_id) if record is not None else None
        if node is None:
            raise ValueError(f"no live actor {actor_id!r}")
        await node.conn.kill_actor(actor_id)

    async def kill_owner(self, owner: str, timeout_s: float = 5.0) -> int:
        """Stop every actor of ``owner``; returns how many."""
        ids = [a.actor_id for a in self.actors.values() if a.owner == owner]
        await asyncio.gather(*(self.kill_actor(i, timeout_s) for i in ids),
                             return_exceptions=True)
        return len(ids)

    # ---- RPC: clients -------------------------------------------------------------------
    async def _rpc_create_actor(self, session: str, spec: list[Any], node: str | None = None,
                                colocate_with: str | None = None,
                                timeout_s: float = DEFAULT_START_TIMEOUT_S) -> list[Any]:
        if not isinstance(session, str) or not session:
            raise ValueError("session must be a non-empty string")
        self._check_session(session)
        self.owner_keys.setdefault(f"client:{session}", current_caller().key)
        self.sessions[session] = time.monotonic()
        handle = await self.create_actor(
            spec_from_wire(spec), f"client:{session}", node=node, colocate_with=colocate_with,
            timeout_s=min(float(timeout_s), 600.0))
        return [handle.actor_id, handle.endpoint, handle.class_path, handle.name]

    async def _rpc_kill_actor(self, session: str, actor_id: str, signal_kill: bool = False
                              ) -> bool:
        self._check_actor(actor_id)
        if signal_kill:
            await self.sigkill_actor(actor_id)
        else:
            await self.kill_actor(actor_id)
        return True

    async def _rpc_actor_died(self, node_id: str, actor_id: str, reason: str) -> bool:
        if not all(isinstance(v, str) for v in (node_id, actor_id, reason)):
            raise ValueError("coord.actor_died takes [node_id: str, actor_id: str, "
                             "reason: str]")
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return False  # only a live node reports deaths
        record = self.actors.get(actor_id)
        if record is not None and record.node_id != node_id:
            return False  # a node reports only its own actors
        if record is None and not node.starting:
            return False  # an unknown actor is only one that node is starting now
        self.actor_died(actor_id, reason)
        return True

    async def _rpc_close_session(self, session: str) -> int:
        if not isinstance(session, str):
            raise ValueError("coord.close_session takes [session: str]")
        self._check_session(session)
        return await self._end_session(session)

    async def _rpc_actor_log(self, actor_id: str, max_bytes: int = 20_000) -> str:
        self._check_actor(actor_id)
        record = self.actors.get(actor_id)
        node = self.nodes.get(record.node_id) if record is not None else None
        if node is None:
            raise ValueError(f"no live actor {actor_id!r}")
        return await node.conn.actor_log(actor_id, min(int(max_bytes), 1 << 20))

    async def _rpc_shutdown(self, with_nodes: bool = False) -> bool:
        caller = current_caller()
        network = self.runtime.network
        security = network.security if network is not None else None
        if not caller.is_admin and security is not None and security.has_admin:
            raise PermissionError(
                "coord.shutdown stops every job and session: with an admin key on the "
                "allow-list only admin keys may call it (use one: `actorrl coordinator "
                "stop --identity admin-NAME`, or Client(..., identity='admin-NAME'))")
        self.shutdown_with_nodes = bool(with_nodes)
        self.shutdown_requested.set()
        return True

    # ---- views --------------------------------------------------------------------------
    def describe_nodes(self) -> list[dict[str, Any]]:
        """Every live node."""
        return [n.describe() for n in sorted(self.nodes.values(), key=lambda n: n.seq)]

    def describe_actors(self, owner: str | None = None, *, caller: Caller | None = None
                        ) -> list[dict[str, Any]]:
        """Every live actor (of ``owner``, when given; only those ``caller`` may see, when
        given)."""
        out = []
        for record in self.actors.values():
            if caller is not None and not caller.owns(self.owner_keys.get(record.owner)):
                continue
            if owner is None or record.owner == owner:
                node = self.nodes.get(record.node_id)
                out.append(record.describe(node.name if node else "?"))
        return out

    def status(self) -> dict[str, Any]:
        """Nodes, actor count, recently lost nodes, plus extra sections (jobs)."""
        out: dict[str, Any] = {"address": self.runtime.address, "nodes": self.describe_nodes(),
                               "num_actors": len(self.actors),
                               "lost_nodes": list(self.lost_nodes)[-10:]}
        for extra in self.extra_status:
            out.update(extra())
        return out


# ---------------------------------------------------------------------------- driver facade
class ClusterDriver(ObjectOps):
    """The :class:`~actorrl.runtime.driver.DriverLike` surface (``create_actor``,
    ``restart_actor``, ``kill_actor``, ``runtime``, get/wait/put/free) over a cluster, for
    one owner (a job or a client).

    ``placement`` maps actor-name patterns (fnmatch) to a preferred node name; ``colocate``
    maps actor-name patterns to the name of another actor of this owner to sit next to.
    """

    def __init__(self, coordinator: Coordinator, owner: str, *,
                 placement: dict[str, str] | None = None,
                 colocate: dict[str, str] | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self.coordinator = coordinator
        self.runtime = coordinator.runtime
        self.owner = owner
        self.placement = dict(placement or {})
        self.colocate = dict(colocate or {})
        self.start_timeout_s = start_timeout_s
        self._replaced: dict[str, Any] = {}

    def _prefer(self, name: str) -> str | None:
        for pattern, node in self.placement.items():
            if fnmatch.fnmatchcase(name, pattern):
                return node
        return None

    def _anchor(self, name: str) -> str | None:
        for pattern, anchor_name in self.colocate.items():
            if fnmatch.fnmatchcase(name, pattern):
                for record in self.coordinator.actors.values():
                    if record.owner == self.owner and record.spec.name == anchor_name and \
                            record.state == "alive":
                        return record.actor_id
        return None

    async def create_actor(self, class_path: str, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None, *, num_cpus: float = 1.0,
                           num_gpus: float = 0.0, name: str = "",
                           env: dict[str, str] | None = None, timeout_s: float | None = None,
                           node: str | None = None,
                           colocate_with: ActorHandle | None = None) -> ActorHandle:
        """Start an actor somewhere in the cluster (see :meth:`Coordinator.create_actor`)."""
        spec = ActorSpec(class_path, tuple(args), dict(kwargs or {}), float(num_cpus),
                         float(num_gpus), name, dict(env or {}))
        return await self._create(spec, timeout_s, node, colocate_with)

    async def _create(self, spec: ActorSpec, timeout_s: float | None, node: str | None = None,
                      colocate_with: ActorHandle | None = None) -> ActorHandle:
        anchor = colocate_with.actor_id if colocate_with is not None else \
            self._anchor(spec.name)
        return await self.coordinator.create_actor(
            spec, self.owner, node=node, prefer=self._prefer(spec.name), colocate_with=anchor,
            timeout_s=self.start_timeout_s if timeout_s is None else timeout_s)

    async def restart_actor(self, handle: ActorHandle, timeout_s: float | None = None
                            ) -> ActorHandle:
        """Start a fresh actor from ``handle``'s spec (stopping the old one if it runs).

        A handle is restarted once: asking again (a caller that saw several of the dead
        actor's calls fail) raises ActorCreationError naming the replacement, so no second
        replacement is started.
        """
        replacement = self._replaced.get(handle.actor_id)
        if replacement is not None:
            raise ActorCreationError(f"{handle!r} was already restarted as {replacement!r}")
        record = self.coordinator.actors.get(handle.actor_id)
        spec = handle.spec or (record.spec if record is not None else None)
        if spec is None:
            raise ValueError(f"{handle!r} carries no creation spec; only its creator can "
                             "restart it")
        pending = asyncio.get_running_loop().create_future()
        self._replaced[handle.actor_id] = pending  # claimed while the new one starts
        try:
            await self.coordinator.kill_actor(handle.actor_id, timeout_s=1.0)
            new = await self._create(spec, timeout_s)
        except BaseException:
            del self._replaced[handle.actor_id]
            pending.cancel()
            raise
        self._replaced[handle.actor_id] = new
        pending.set_result(new)
        return new

    async def kill_actor(self, handle: ActorHandle, timeout_s: float = 5.0) -> None:
        """Stop an actor: exit request, SIGKILL after ``timeout_s``."""
        await self.coordinator.kill_actor(handle.actor_id, timeout_s)

    @property
    def local_gpus(self) -> float:
        """0.0: a cluster has no single node whose GPUs an actor gets without asking (ask
        with ``num_gpus``; placement finds a node that has them)."""
        return 0.0

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop every actor of this owner."""
        await self.coordinator.kill_owner(self.owner, timeout_s)
