"""The cluster coordinator: node membership, actor placement and actor lifecycles.

Who talks to whom::

    node agent --coord.register_node / coord.heartbeat / coord.actor_died--> coordinator
    coordinator --node.start_actor / node.stop_actor / node.kill_actor-->     node agent
    client     --coord.create_actor / coord.nodes / job.* ...-->              coordinator
    anyone holding a handle or ref --__call__ / __fetch__-->                  the actor itself

Placement: an actor asks for ``num_cpus``/``num_gpus``; the coordinator keeps a ledger of
what every live actor asked for per node and places it (:mod:`actorrl.runtime.cluster.placement`).
When nothing fits it waits, up to the request's deadline, for a node to join or an actor
to exit.

Failure: a node reports the deaths of its actors; a node that misses heartbeats is lost
(:mod:`actorrl.runtime.cluster.membership`), and all its actors are declared dead. Declared
deaths fail pending calls at once (:meth:`Runtime.mark_dead`); owners (jobs) then recreate
what they need through :class:`~actorrl.runtime.cluster.driver.ClusterDriver`.

Roles (keys carry one, see :mod:`transport.auth` and :mod:`actorrl.runtime.cluster.callers`):
``coord.register_node`` / ``heartbeat`` / ``actor_died`` / ``leave`` take node keys (and
the coordinator's own); the client methods take client and admin keys; a client key sees
and stops only the actors of sessions it opened (and of jobs it submitted), an admin key
all of them; ``coord.shutdown`` takes an admin key (a client key too while no admin key is
on the allow-list). Connections without CURVE (ipc, keyless loopback) are trusted.
Handlers read who called through :func:`~actorrl.runtime.cluster.callers.current_caller`.

Versions: a node registering and a client saying hello or opening a session send their
wire version (:mod:`actorrl.runtime.wire_version`); another one, or none, is refused with a
message naming both versions and the fix.

Nothing here knows about reinforcement learning; jobs are served by a layer above.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from actorrl.runtime.cluster.callers import (
    CLIENT_ROLES,
    NODE_ROLES,
    Caller,
    current_caller,
    serve_async,
    serve_guarded,
)
from actorrl.runtime.cluster.client_sessions import DEFAULT_SESSION_TIMEOUT_S, ClientSessions
from actorrl.runtime.cluster.connections import NodeConnection
from actorrl.runtime.cluster.membership import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    LEFT,
    Membership,
)
from actorrl.runtime.cluster.placement import choose_node, find_node, no_room_message
from actorrl.runtime.cluster.records import ActorRecord, NodeState
from actorrl.runtime.errors import ActorCreationError
from actorrl.runtime.node.node import DEFAULT_START_TIMEOUT_S, LocalNode
from actorrl.runtime.process.handles import ActorHandle, ActorSpec
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.wire import spec_from_wire
from actorrl.runtime.wire_version import WIRE_VERSION, VersionGate
from actorrl.util.forward import PartAttribute
from transport.errors import PeerLostError
from transport.rpc import Request
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000
"""A reported death reason is kept at most this long (a peer chooses its size)."""
MAX_EARLY_DEATHS = 1_000
"""Deaths of actors whose start was not answered yet, kept until it is."""


class Coordinator:
    """Membership, placement and actor lifecycles for a cluster, served on ``runtime``.

    Call :meth:`serve` to expose the ``coord.*`` methods, :meth:`start` to begin heartbeat
    monitoring, :meth:`shutdown` to stop every actor and release the nodes.
    """

    def __init__(self, runtime: Runtime, heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> None:
        self.runtime = runtime
        self.client_sessions = ClientSessions(session_timeout_s)
        self.versions = VersionGate()
        """Refuses nodes and clients of another wire version."""
        self.owner_keys: dict[str, str | None] = {}
        """Owner (``client:SESSION``, ``job:ID``) -> the public key that created it (None:
        a trusted caller); a client key may act only on owners created with it."""
        self.membership = Membership(runtime, heartbeat_s, heartbeat_timeout_s,
                                     actor_lost=self.actor_died, changed=self._notify,
                                     spawn=self._spawn)
        self.actors: dict[str, ActorRecord] = {}
        self.on_actor_died: list[Callable[[ActorRecord], None]] = []
        self.shutdown_requested = asyncio.Event()
        self.shutdown_with_nodes = False
        self._changed = asyncio.Event()
        self._early_deaths: dict[str, str] = {}
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.extra_status: list[Callable[[], dict[str, Any]]] = []

    heartbeat_s = PartAttribute[float]("membership")
    """How often nodes heartbeat (and silent nodes and sessions are checked)."""

    heartbeat_timeout_s = PartAttribute[float]("membership")
    """A node silent for this long is probed, then lost."""

    nodes = PartAttribute[dict[str, NodeState]]("membership")
    """The live member nodes by id (:attr:`Membership.nodes`)."""

    lost_nodes = PartAttribute[Sequence[dict[str, Any]]]("membership")
    """The recently lost nodes, oldest first (:attr:`Membership.lost_nodes`)."""

    on_node_lost = PartAttribute[list[Callable[[NodeState, str], None]]]("membership")
    """Called with each lost node and the reason (:attr:`Membership.on_node_lost`)."""

    sessions = PartAttribute[dict[str, float]]("client_sessions", "pinged")
    """Client sessions owning actors -> when they last pinged (monotonic)."""

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
        serve_guarded(rt, "coord.hello", self._on_hello)
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
        self.membership.closing = True
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

    async def wait_change(self, timeout_s: float) -> None:
        """Return at the next change of the cluster's state (a node joined or lost, an
        actor's state changed) or after ``timeout_s``, whichever is first."""
        event = self._changed
        try:
            await wait_for(event.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            pass

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- membership (see Membership) ---------------------------------------------------
    def add_node(self, node_id: str, name: str, endpoint: str, host: str, num_cpus: float,
                 num_gpus: float, conn: NodeConnection) -> NodeState:
        """Add a member (idempotent per ``node_id``); names are made unique."""
        return self.membership.add_node(node_id, name, endpoint, host, num_cpus, num_gpus,
                                        conn)

    def add_local_node(self, local: LocalNode, name: str = "local") -> NodeState:
        """Make an in-process :class:`LocalNode` a member (no heartbeats needed)."""
        return self.membership.add_local_node(local, name)

    def node_lost(self, node: NodeState, reason: str) -> None:
        """Declare ``node`` lost: every actor on it is dead."""
        self.membership.node_lost(node, reason)

    async def _watch_heartbeats(self) -> None:
        """Lose silent nodes and end silent client sessions, every ``heartbeat_s``."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.heartbeat_s)
            now = time.monotonic()
            stall = now - last - self.heartbeat_s
            last = now
            self.membership.check_heartbeats(now, stall)
            self._expire_sessions(now)

    def _expire_sessions(self, now: float) -> None:
        for session, silent_s in self.client_sessions.expire(now):
            # The client went away without closing: its actors go too.
            log.warning("client session %s silent for %.0f s; stopping its actors",
                        session[:8], silent_s)
            self._spawn(self._end_session(session))

    async def _end_session(self, session: str) -> int:
        """Stop a session's actors and forget it (and who owned it)."""
        self.client_sessions.forget(session)
        try:
            return await self.kill_owner(f"client:{session}")
        finally:
            if session not in self.client_sessions:  # (not reopened meanwhile)
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
        known = isinstance(session, str) and session in self.client_sessions and \
            current_caller().owns(self.owner_keys.get(f"client:{session}"))
        if known:
            self.client_sessions.touch(session)
        request.reply({"known": known})

    def _on_hello(self, request: Request) -> None:
        """What a client needs to know first; a client that sends its wire version is
        refused when it is not this one (a bare hello, a probe, is answered)."""
        if request.args:
            self.versions.admit(request.args[0], "client", peer_name(current_caller()))
        rt = self.runtime
        request.reply({"address": rt.address, "max_frame_bytes": rt.server.max_frame_bytes,
                       "wire_version": WIRE_VERSION})

    async def _rpc_register_node(self, node_id: str, name: str, endpoint: str, host: str,
                                 num_cpus: float, num_gpus: float, wire_version: Any = None
                                 ) -> dict[str, Any]:
        # The version first: the other fields of another version may mean other things.
        self.versions.admit(wire_version, f"node {name!r:.80} at {host!r:.80}",
                            peer_name(current_caller()))
        if not all(isinstance(v, str) and v for v in (node_id, name, endpoint, host)):
            raise ValueError("node_id, name, endpoint and host must be non-empty strings")
        for value in (num_cpus, num_gpus):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"node resources must be numbers >= 0, got {value!r}")
        node = self.membership.register(node_id, name, endpoint, host, num_cpus, num_gpus)
        return {"name": node.name, "heartbeat_s": self.heartbeat_s,
                "heartbeat_timeout_s": self.heartbeat_timeout_s, "wire_version": WIRE_VERSION}

    def _on_heartbeat(self, request: Request) -> None:
        known = bool(request.args) and self.membership.heartbeat(request.args[0])
        request.reply({"known": known})

    async def _rpc_leave(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is not None:
            self.membership.node_lost(node, LEFT)
        return True

    async def _rpc_wait_nodes(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + min(float(timeout_s), 300.0)
        while len(self.nodes) < count and time.monotonic() < deadline:
            await self.wait_change(deadline - time.monotonic())
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
            await self.wait_change(deadline - time.monotonic())

    # ---- placement (see actorrl.runtime.cluster.placement) --------------------------------------
    def choose_node(self, spec: ActorSpec, node: str | None = None, prefer: str | None = None,
                    colocate_with: str | None = None,
                    exclude: set[str] | frozenset[str] = frozenset()) -> NodeState | None:
        """The node for ``spec``, or None when none has room now."""
        return choose_node(self.nodes, self.actors, spec, self.heartbeat_s, node, prefer,
                           colocate_with, exclude)

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
                if node is not None and find_node(self.nodes.values(), node) is None and not any(
                        n.node_id in failed_nodes for n in self.nodes.values()):
                    known = ", ".join(sorted(n.name for n in self.nodes.values())) or "none"
                    raise ActorCreationError(f"no node named {node!r} (nodes: {known})")
                if loop.time() >= deadline:
                    raise ActorCreationError(no_room_message(self.nodes.values(), spec, node))
                if failed_nodes and not [n for n in self.nodes.values()
                                         if n.node_id not in failed_nodes]:
                    failed_nodes.clear()  # the survivors may have recovered by now
                await self.wait_change(min(deadline - loop.time(), 1.0))
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
                self.membership.suspect(target, f"start_actor failed: {exc}")
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
                                timeout_s: float = DEFAULT_START_TIMEOUT_S,
                                wire_version: Any = None) -> list[Any]:
        if not isinstance(session, str) or not session:
            raise ValueError("session must be a non-empty string")
        self._check_session(session)
        # This opens the session: a client of another version (or of a release from
        # before versions, which sends none) gets no actor.
        self.versions.admit(wire_version, "client", peer_name(current_caller()))
        self.owner_keys.setdefault(f"client:{session}", current_caller().key)
        with self.client_sessions.creating(session):
            handle = await self.create_actor(
                spec_from_wire(spec), f"client:{session}", node=node,
                colocate_with=colocate_with, timeout_s=min(float(timeout_s), 600.0))
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
                               "num_actors": len(self.actors), "wire_version": WIRE_VERSION,
                               "lost_nodes": list(self.lost_nodes)[-10:]}
        for extra in self.extra_status:
            out.update(extra())
        return out


def peer_name(caller: Caller) -> str:
    """Who a caller is, for the log: its role and key, or a trusted connection."""
    if caller.key is None:
        return "a trusted connection (ipc or keyless)"
    return f"{caller.role} key {caller.key[:12]}..."
