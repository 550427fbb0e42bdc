"""A node agent: joins a coordinator and runs actors on this host for it.

``actorrl node join tcp://COORDINATOR:PORT --cpus N --gpus N --keys DIR`` runs one. It

1. starts a runtime bound to ipc (for its own actors) and ``tcp://HOST:0`` (CURVE with
   keys), and a :class:`LocalNode` whose actor processes bind the same way, so handles and
   refs of actors here carry endpoints other hosts can reach;
2. registers with the coordinator (retrying until it answers) and heartbeats; a
   coordinator that refuses this node's key, or whose key is not the one in
   ``coordinator.public``, is retried with backoff ``auth_attempts`` times, then the agent
   fails with :class:`NodeJoinError` naming the address and the key problem; it sends
   this release's wire version, and a coordinator of another actorrl version refuses it
   (:mod:`actorrl.runtime.wire_version`): the agent fails at once with that message
   (:mod:`actorrl.runtime.cluster.coordinator_link` does the talking);
3. serves ``node.start_actor`` / ``node.stop_actor`` / ``node.kill_actor`` /
   ``node.release`` / ``node.actor_log`` to the coordinator's key only (other CURVE keys
   get a PermissionError reply naming the role required), and reports every unasked
   actor death with an acknowledged call;
4. when the coordinator is lost (heartbeats unanswered for its timeout), stops all its
   actors (their jobs are the coordinator's to recreate) and tries to register again, so a
   restarted coordinator gets its nodes back.

SIGTERM/SIGINT: leave the cluster, stop the actors, exit. However :meth:`NodeAgent.run`
ends (a failed start included), the temporary session directory it made is removed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from typing import Any

from actorrl.runtime.cluster.callers import COORDINATOR_ROLES, serve_async, serve_guarded
from actorrl.runtime.cluster.coordinator_link import (
    DEFAULT_AUTH_ATTEMPTS,
    DEFAULT_AUTH_RETRY_S,
    CoordinatorLink,
    JoinSettings,
    NodeJoinError,
    NodeOffer,
)
from actorrl.runtime.network import Network
from actorrl.runtime.node.forking import resolve_start_method
from actorrl.runtime.node.node import LocalNode
from actorrl.runtime.process.handles import ActorHandle
from actorrl.runtime.process.peers import remove_ipc_fallback
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.wire import spec_from_wire
from actorrl.runtime.sessions import make_session_dir
from actorrl.util.forward import PartAttribute
from transport.auth import load_public_key
from transport.endpoint import Endpoint
from transport.limits import raise_fd_limit

__all__ = ["DEFAULT_AUTH_ATTEMPTS", "DEFAULT_AUTH_RETRY_S", "CoordinatorAddressError",
           "NodeAgent", "NodeJoinError", "check_resolvable", "coordinator_endpoint",
           "coordinator_host", "route_host"]


class CoordinatorAddressError(ConnectionError):
    """A coordinator address whose host does not resolve or cannot be routed to (the
    message names the address)."""


def coordinator_host(address: str) -> str:
    """The host part of ``tcp://HOST:PORT`` (brackets of IPv6 literals removed)."""
    return address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


def check_resolvable(address: str) -> None:
    """:class:`CoordinatorAddressError` naming ``address`` unless its host resolves (ipc
    addresses and IP literals always do)."""
    if not address.startswith("tcp://"):
        return
    host = coordinator_host(address)
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) and exc.strerror else exc
        raise CoordinatorAddressError(
            f"cannot resolve the coordinator host {host!r} of {address}: {reason}; check "
            "the address (tcp://HOST:PORT) and this host's DNS") from None


def coordinator_endpoint(address: str, keys_dir: str | None) -> str:
    """The coordinator's endpoint for callers: with keys, its CURVE public key
    (``coordinator.public``) rides along so the connection is encrypted and the
    coordinator authenticated. A host that does not resolve raises
    :class:`CoordinatorAddressError` naming ``address``."""
    check_resolvable(address)
    if keys_dir is None or address.startswith("ipc://"):  # ipc: a private socket, no CURVE
        return address
    return str(Endpoint(address, load_public_key(keys_dir, "coordinator")))


def route_host(address: str) -> str:
    """This host's IP on the route to ``address`` (no packet is sent); loopback targets
    give 127.0.0.1. Failures raise :class:`CoordinatorAddressError` naming ``address``."""
    host = coordinator_host(address)
    if host in ("localhost", "") or host.startswith("127."):
        return "127.0.0.1"
    check_resolvable(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError as exc:
        raise CoordinatorAddressError(
            f"no route to the coordinator host {host!r} of {address}: "
            f"{exc.strerror or exc}; check the address or pass --host IP") from None


class NodeAgent:
    """One host's member of a cluster. Run with :meth:`run` on the process's loop.

    Its link to the coordinator (registration, heartbeats, death reports) is
    :attr:`link`; its actors are those of :attr:`local`, started and stopped at the
    coordinator's request."""

    def __init__(self, coordinator: str, *, name: str | None = None, host: str | None = None,
                 num_cpus: float | None = None, num_gpus: float | None = None,
                 keys_dir: str | None = None, identity: str = "node",
                 session_dir: str | None = None, connect_timeout_s: float = 5.0,
                 auth_attempts: int = DEFAULT_AUTH_ATTEMPTS,
                 auth_retry_s: float = DEFAULT_AUTH_RETRY_S,
                 insecure_loopback: bool = False, start_method: str | None = None) -> None:
        """Nothing is created until :meth:`run`; a coordinator address that does not
        resolve, missing keys, a keyless tcp bind and an unknown ``start_method`` (fork or
        spawn, see :class:`~actorrl.runtime.node.node.LocalNode`) fail here.

        A coordinator at an ``ipc://`` address (a keyless one on this host) makes a node
        that binds ipc only, unless ``host`` is given. Binding tcp needs ``keys_dir``, or on
        loopback ``insecure_loopback`` (:func:`transport.auth.check_bind`)."""
        host = host or (None if coordinator.startswith("ipc://") else route_host(coordinator))
        self.start_method = resolve_start_method(start_method)
        self.name = name or f"{socket.gethostname()}-{uuid.uuid4().hex[:4]}"
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self._owns_session_dir = session_dir is None
        self.session_dir = os.path.abspath(session_dir) if session_dir else ""
        """The node's sockets and actor logs; without ``session_dir`` a temporary directory
        made by :meth:`run` (and removed when it ends)."""
        self.runtime: Runtime | None = None
        self.local: LocalNode | None = None
        self.stop_event = asyncio.Event()
        self.link = CoordinatorLink(
            JoinSettings(coordinator, coordinator_endpoint(coordinator, keys_dir), keys_dir,
                         identity, connect_timeout_s, auth_attempts, auth_retry_s),
            self.stop_event)
        self._network = Network.create(host, f"node-{uuid.uuid4().hex[:12]}", keys_dir,
                                       identity, insecure_loopback=insecure_loopback)

    host = PartAttribute[str | None]("_network")
    """Where this node binds tcp (None: ipc only)."""

    joined = PartAttribute[asyncio.Event]("link")
    """Set while the coordinator counts this node as a member."""

    node_id = PartAttribute[str]("link")
    """This node's id at its coordinator (a new one per registration)."""

    registered_name = PartAttribute[str]("link")
    """The name the coordinator gave this node ("" before it joined)."""

    # ---- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        """Join, serve and heartbeat until :meth:`stop` (or SIGTERM in the CLI).

        Raises :class:`NodeJoinError` when the coordinator keeps refusing the keys or runs
        another actorrl version; whatever ends it, the actors are stopped and a temporary
        session directory is removed. The soft fd limit is raised to the hard one first
        (the peer cap stays below it)."""
        raise_fd_limit()
        network = self._network
        if self._owns_session_dir:
            self.session_dir = make_session_dir("node")
        local: LocalNode | None = None
        runtime: Runtime | None = None
        try:
            os.makedirs(self.session_dir, exist_ok=True)
            runtime = self.runtime = Runtime.start(self.session_dir, "node", network=network)
            local = self.local = LocalNode(runtime, self.session_dir, self.num_cpus,
                                           self.num_gpus, child_env=network.to_env(),
                                           start_method=self.start_method)
            local.on_death.append(self.link.report_death)
            # node.* is the coordinator's: other keys (clients, other nodes, admins) are
            # refused; this node's own processes (ipc, no CURVE) are trusted.
            for method, fn in (("node.start_actor", self._start_actor),
                               ("node.stop_actor", self._stop_actor),
                               ("node.kill_actor", self._kill_actor),
                               ("node.release", self._release)):
                serve_async(runtime, method, fn, COORDINATOR_ROLES)
            serve_guarded(runtime, "node.info", lambda r: r.reply(self.info()),
                          COORDINATOR_ROLES)
            serve_guarded(runtime, "node.actor_log",
                          lambda r: r.reply(self._actor_log(*r.args)), COORDINATOR_ROLES)
            offer = NodeOffer(self.name, runtime.address, self.host or "localhost",
                              local.num_cpus, local.num_gpus)
            await self.link.stay_joined(runtime, offer, self._stop_all)
        finally:
            try:
                if local is not None:
                    await local.shutdown()
                self.link.close()
                if runtime is not None:
                    runtime.close()
            finally:
                remove_ipc_fallback(self.session_dir)
                if self._owns_session_dir:
                    shutil.rmtree(self.session_dir, ignore_errors=True)

    def stop(self) -> None:
        """Leave the cluster and exit :meth:`run`."""
        self.stop_event.set()

    def info(self) -> dict[str, Any]:
        """Name, resources and actor processes of this node."""
        local = self.local
        assert local is not None and self.runtime is not None
        return {"node_id": self.node_id, "name": self.registered_name or self.name,
                "endpoint": self.runtime.address, "num_cpus": local.num_cpus,
                "num_gpus": local.num_gpus, "pid": os.getpid(),
                "actors": {a: r.process.pid for a, r in local.actors.items()}}

    # ---- served to the coordinator ------------------------------------------------------
    async def _start_actor(self, spec: list[Any], timeout_s: float) -> list[Any]:
        assert self.local is not None
        handle = await self.local.start_actor(spec_from_wire(spec), float(timeout_s))
        process = self.local.process_of(handle)
        return [handle.actor_id, handle.endpoint, process.pid if process else 0]

    async def _stop_actor(self, actor_id: str, timeout_s: float = 5.0) -> bool:
        assert self.local is not None
        await self.local.stop_actor(ActorHandle(actor_id, ""), float(timeout_s))
        return True

    async def _kill_actor(self, actor_id: str) -> bool:
        assert self.local is not None
        self.local.kill_actor(ActorHandle(actor_id, ""))
        return True

    def _actor_log(self, actor_id: str, max_bytes: int = 20_000) -> str:
        assert self.local is not None
        process = self.local.process_of(ActorHandle(actor_id, ""))
        return process.log_tail(min(int(max_bytes), 1 << 20)) if process is not None else ""

    async def _release(self, exit_node: bool = False) -> bool:
        await self._stop_all()
        if exit_node:
            self.stop()
        return True

    async def _stop_all(self) -> None:
        assert self.local is not None
        await asyncio.gather(*(self.local.stop_actor(ActorHandle(a, ""), 2.0)
                               for a in list(self.local.actors)))
