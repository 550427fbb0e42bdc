"""A node agent: joins a coordinator and runs actors on this host for it.

``actorrl node join tcp://COORDINATOR:PORT --cpus N --gpus N --keys DIR`` runs one. It

1. starts a runtime bound to ipc (for its own actors) and ``tcp://HOST:0`` (CURVE with
   keys), and a :class:`LocalNode` whose actor processes bind the same way, so handles and
   refs of actors here carry endpoints other hosts can reach;
2. registers with the coordinator (retrying until it answers) and heartbeats; a
   coordinator that refuses this node's key, or whose key is not the one in
   ``coordinator.public``, is retried with backoff ``auth_attempts`` times, then the agent
   fails with :class:`NodeJoinError` naming the address and the key problem;
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
import contextlib
import logging
import os
import shutil
import socket
import time
import uuid
from typing import Any

from actorrl.runtime.cluster.callers import COORDINATOR_ROLES, serve_async, serve_guarded
from actorrl.runtime.cluster.membership import DEFAULT_HEARTBEAT_S
from actorrl.runtime.network import Network
from actorrl.runtime.node.forking import resolve_start_method
from actorrl.runtime.node.node import LocalNode
from actorrl.runtime.process.handles import ActorHandle
from actorrl.runtime.process.peers import remove_ipc_fallback
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.process.wire import spec_from_wire
from actorrl.runtime.sessions import make_session_dir
from transport.auth import load_public_key
from transport.endpoint import Endpoint
from transport.errors import AuthenticationError
from transport.limits import raise_fd_limit
from transport.rpc import RpcClient
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

DEFAULT_AUTH_ATTEMPTS = 5
"""Registration tries refused by CURVE authentication before a node gives up."""
DEFAULT_AUTH_RETRY_S = 0.5
"""First wait after an authentication failure; doubled after each one."""


class NodeJoinError(ConnectionError):
    """A node gave up joining its coordinator: the keys were refused again and again (the
    message names the address and what to fix)."""


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
    """One host's member of a cluster. Run with :meth:`run` on the process's loop."""

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
        self.coordinator_address = coordinator
        self.host: str | None = host or (
            None if coordinator.startswith("ipc://") else route_host(coordinator))
        self.insecure_loopback = insecure_loopback
        self.start_method = resolve_start_method(start_method)
        self.name = name or f"{socket.gethostname()}-{uuid.uuid4().hex[:4]}"
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.keys_dir = keys_dir
        self.identity = identity
        self.connect_timeout_s = connect_timeout_s
        self.auth_attempts = max(1, auth_attempts)
        self.auth_retry_s = auth_retry_s
        self._owns_session_dir = session_dir is None
        self.session_dir = os.path.abspath(session_dir) if session_dir else ""
        """The node's sockets and actor logs; without ``session_dir`` a temporary directory
        made by :meth:`run` (and removed when it ends)."""
        self.node_id = ""
        self.registered_name = ""
        self.runtime: Runtime | None = None
        self.local: LocalNode | None = None
        self.stop_event = asyncio.Event()
        self.joined = asyncio.Event()
        self._coord: RpcClient | None = None
        self._coord_endpoint = coordinator_endpoint(coordinator, keys_dir)
        self._network = Network.create(self.host, f"node-{uuid.uuid4().hex[:12]}", keys_dir,
                                       identity, insecure_loopback=insecure_loopback)
        self._heartbeat_s = DEFAULT_HEARTBEAT_S
        self._heartbeat_timeout_s = 3.0
        self._tasks: set[asyncio.Task] = set()

    # ---- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        """Join, serve and heartbeat until :meth:`stop` (or SIGTERM in the CLI).

        Raises :class:`NodeJoinError` when the coordinator keeps refusing the keys; whatever
        ends it, the actors are stopped and a temporary session directory is removed.
        The soft fd limit is raised to the hard one first (the peer cap stays below it)."""
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
            local.on_death.append(self._on_actor_death)
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
            while not self.stop_event.is_set():
                if not await self._register():
                    break
                await self._heartbeat_until_lost()
                if self.stop_event.is_set():
                    break  # still joined: leave below, so the coordinator says "left"
                self.joined.clear()
                await self._stop_all()
            await self._leave()
            self.joined.clear()
        finally:
            try:
                if local is not None:
                    await local.shutdown()
                if self._coord is not None:
                    self._coord.close()
                    self._coord = None
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

    # ---- talking to the coordinator -----------------------------------------------------
    def _fresh_client(self) -> RpcClient:
        # A new connection per attempt: requests queued for an unreachable coordinator are
        # dropped with the old socket instead of arriving in a burst later.
        if self._coord is not None:
            self._coord.close()
        assert self.runtime is not None
        self._coord = self.runtime.connect(self._coord_endpoint, self.connect_timeout_s)
        return self._coord

    async def _register(self) -> bool:
        """Register (new node id each time), retrying until it works or we stop; an
        authentication failure is retried with backoff ``auth_attempts`` times in a row,
        then raises :class:`NodeJoinError`."""
        assert self.runtime is not None and self.local is not None
        delay = 0.2
        auth_failures = 0
        self.node_id = uuid.uuid4().hex
        while not self.stop_event.is_set():
            client = self._fresh_client()
            try:
                reply = await client.call(
                    "coord.register_node",
                    [self.node_id, self.name, self.runtime.address, self.host or "localhost",
                     self.local.num_cpus, self.local.num_gpus],
                    timeout_s=self.connect_timeout_s)
            except AuthenticationError as exc:
                auth_failures += 1
                problem = self._key_problem(exc)
                if auth_failures >= self.auth_attempts:
                    raise NodeJoinError(f"cannot join the coordinator at "
                                        f"{self.coordinator_address}: {problem} (gave up "
                                        f"after {auth_failures} tries)") from None
                wait_s = self.auth_retry_s * 2 ** (auth_failures - 1)
                log.error("cannot join the coordinator at %s: %s (try %d of %d; retrying in "
                          "%.1f s)", self.coordinator_address, problem, auth_failures,
                          self.auth_attempts, wait_s)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.stop_event.wait(), wait_s)
                continue
            except Exception as exc:
                auth_failures = 0
                log.warning("could not register with %s: %s (retrying in %.1f s)",
                            self.coordinator_address, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.stop_event.wait(), delay)
                delay = min(delay * 2, 2.0)
                continue
            self.registered_name = reply["name"]
            self._heartbeat_s = float(reply["heartbeat_s"])
            self._heartbeat_timeout_s = float(reply["heartbeat_timeout_s"])
            log.info("joined %s as node %s", self.coordinator_address, self.registered_name)
            self.joined.set()
            return True
        return False

    def _key_problem(self, exc: AuthenticationError) -> str:
        """What is wrong with the keys, and how to fix it, for an authentication failure."""
        keys = self.keys_dir
        if keys is None:
            return ("it closed the connection during the handshake, so it most likely "
                    "requires CURVE keys and this node has none: join with --keys DIR (the "
                    "directory `actorrl keys generate` made, copied from the coordinator's "
                    "host)")
        if exc.key_refused:
            return (f"it refused this node's key ({keys}/{self.identity}.public is not on its "
                    "allow-list): copy that file into the coordinator's keys directory and "
                    "restart the coordinator, or join with the keys directory it uses")
        return (f"the CURVE handshake failed ({keys}/coordinator.public is most likely not "
                "the key of the coordinator at that address): copy coordinator.public from "
                "the coordinator's keys directory")

    async def _heartbeat_until_lost(self) -> None:
        last_ok = time.monotonic()
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.stop_event.wait(), self._heartbeat_s)
            if self.stop_event.is_set():
                return
            client = self._coord
            if client is None or (client.lost is not None and not client.connected):
                client = self._fresh_client()
            try:
                reply = await client.call("coord.heartbeat", [self.node_id],
                                          timeout_s=self._heartbeat_timeout_s)
            except Exception as exc:
                if time.monotonic() - last_ok > self._heartbeat_timeout_s:
                    log.warning("coordinator lost (%s); stopping this node's actors and "
                                "joining again", exc)
                    return
                continue
            if not reply.get("known"):
                log.warning("the coordinator no longer knows this node; joining again")
                return
            last_ok = time.monotonic()

    async def _leave(self) -> None:
        if self._coord is None or not self.joined.is_set():
            return
        with contextlib.suppress(Exception):
            await self._coord.call("coord.leave", [self.node_id], timeout_s=2)

    def _on_actor_death(self, actor_id: str, reason: str) -> None:
        task = asyncio.get_running_loop().create_task(self._report_death(actor_id, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_death(self, actor_id: str, reason: str) -> None:
        for _ in range(5):  # acknowledged; retried while this node is registered
            client = self._coord
            if client is None or not self.joined.is_set():
                return
            try:
                await client.call("coord.actor_died", [self.node_id, actor_id, reason],
                                  timeout_s=self._heartbeat_timeout_s)
                return
            except Exception as exc:
                log.debug("death report for %s failed: %s", actor_id[:8], exc)

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
