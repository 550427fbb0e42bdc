"""A node agent's link to its coordinator: registering, heartbeats, death reports, leaving.

:meth:`CoordinatorLink.stay_joined` registers the node (a new node id each time, with
this release's wire version), heartbeats, and registers again whenever the coordinator is
lost, until the node stops. A coordinator that refuses the node's key, or whose key is not
the one in ``coordinator.public``, is retried with backoff ``auth_attempts`` times, then
:class:`NodeJoinError` names the address and the key problem; a coordinator of another
actorrl version is given up at once, with its message naming both versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from actorrl.runtime.cluster.membership import DEFAULT_HEARTBEAT_S
from actorrl.runtime.process.runtime import Runtime
from actorrl.runtime.wire_version import WIRE_VERSION, WireVersionError, old_coordinator_message
from transport.errors import AuthenticationError, RemoteError
from transport.rpc import RpcClient
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

DEFAULT_AUTH_ATTEMPTS = 5
"""Registration tries refused by CURVE authentication before a node gives up."""
DEFAULT_AUTH_RETRY_S = 0.5
"""First wait after an authentication failure; doubled after each one."""


class NodeJoinError(ConnectionError):
    """A node gave up joining its coordinator: the keys were refused again and again, or
    the coordinator runs another actorrl version (the message names the address and what
    to fix)."""


@dataclass(frozen=True)
class JoinSettings:
    """How a node reaches its coordinator and how hard it tries."""

    address: str
    """The coordinator's address as given (``tcp://HOST:PORT``), for messages."""
    endpoint: str
    """What callers connect to (with keys: the address and the coordinator's key)."""
    keys_dir: str | None = None
    identity: str = "node"
    """Which key pair of ``keys_dir`` the node uses."""
    connect_timeout_s: float = 5.0
    auth_attempts: int = DEFAULT_AUTH_ATTEMPTS
    auth_retry_s: float = DEFAULT_AUTH_RETRY_S


@dataclass(frozen=True)
class NodeOffer:
    """What a node registers with: its name, control endpoint, host and resources."""

    name: str
    endpoint: str
    host: str
    num_cpus: float
    num_gpus: float


class CoordinatorLink:
    """One node's membership of its coordinator's cluster, until ``stopping`` is set."""

    def __init__(self, settings: JoinSettings, stopping: asyncio.Event) -> None:
        self.settings = settings
        self.stopping = stopping
        self.joined = asyncio.Event()
        """Set while the coordinator counts this node as a member."""
        self.node_id = ""
        self.registered_name = ""
        """The name the coordinator gave this node (made unique among its nodes)."""
        self._heartbeat_s = DEFAULT_HEARTBEAT_S
        self._heartbeat_timeout_s = 3.0
        self._client: RpcClient | None = None
        self._reports: set[asyncio.Task] = set()

    async def stay_joined(self, runtime: Runtime, offer: NodeOffer,
                          rejoining: Callable[[], Awaitable[None]]) -> None:
        """Register, heartbeat, and register again after ``rejoining()`` whenever the
        coordinator is lost, until ``stopping``; then leave. Raises :class:`NodeJoinError`
        when the coordinator keeps refusing the keys or runs another actorrl version."""
        while not self.stopping.is_set():
            if not await self._register(runtime, offer):
                break
            await self._heartbeat_until_lost(runtime)
            if self.stopping.is_set():
                break  # still joined: leave below, so the coordinator says "left"
            self.joined.clear()
            await rejoining()
        await self._leave()
        self.joined.clear()

    def close(self) -> None:
        """Drop the connection to the coordinator."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def report_death(self, actor_id: str, reason: str) -> None:
        """Tell the coordinator that an actor of this node exited unasked (in the
        background, acknowledged, retried while this node is registered)."""
        task = asyncio.get_running_loop().create_task(self._report_death(actor_id, reason))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    # ---- registering --------------------------------------------------------------------
    def _fresh_client(self, runtime: Runtime) -> RpcClient:
        # A new connection per attempt: requests queued for an unreachable coordinator are
        # dropped with the old socket instead of arriving in a burst later.
        self.close()
        self._client = runtime.connect(self.settings.endpoint,
                                       self.settings.connect_timeout_s)
        return self._client

    async def _register(self, runtime: Runtime, offer: NodeOffer) -> bool:
        """Register (new node id each time), retrying until it works or we stop; an
        authentication failure is retried with backoff ``auth_attempts`` times in a row,
        then raises :class:`NodeJoinError`, as does a coordinator of another version."""
        settings = self.settings
        attempts = max(1, settings.auth_attempts)
        delay = 0.2
        auth_failures = 0
        self.node_id = uuid.uuid4().hex
        while not self.stopping.is_set():
            client = self._fresh_client(runtime)
            try:
                reply = await client.call(
                    "coord.register_node",
                    [self.node_id, offer.name, offer.endpoint, offer.host, offer.num_cpus,
                     offer.num_gpus, WIRE_VERSION],
                    timeout_s=settings.connect_timeout_s)
            except AuthenticationError as exc:
                auth_failures += 1
                problem = self._key_problem(exc)
                if auth_failures >= attempts:
                    raise NodeJoinError(f"cannot join the coordinator at "
                                        f"{settings.address}: {problem} (gave up "
                                        f"after {auth_failures} tries)") from None
                wait_s = settings.auth_retry_s * 2 ** (auth_failures - 1)
                log.error("cannot join the coordinator at %s: %s (try %d of %d; retrying in "
                          "%.1f s)", settings.address, problem, auth_failures, attempts,
                          wait_s)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.stopping.wait(), wait_s)
                continue
            except Exception as exc:
                self._refuse_other_version(exc)
                auth_failures = 0
                log.warning("could not register with %s: %s (retrying in %.1f s)",
                            settings.address, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.stopping.wait(), delay)
                delay = min(delay * 2, 2.0)
                continue
            self.registered_name = reply["name"]
            self._heartbeat_s = float(reply["heartbeat_s"])
            self._heartbeat_timeout_s = float(reply["heartbeat_timeout_s"])
            log.info("joined %s as node %s", settings.address, self.registered_name)
            self.joined.set()
            return True
        return False

    def _refuse_other_version(self, exc: Exception) -> None:
        """Raise :class:`NodeJoinError` when a registration failed because the coordinator
        runs another actorrl version: it said so, or (a release from before versions) it
        refused the version argument itself. Retrying would not help."""
        address = self.settings.address
        if isinstance(exc, WireVersionError) and isinstance(exc, RemoteError):
            raise NodeJoinError(f"cannot join the coordinator at {address}: "
                                f"{exc.message}") from None
        if isinstance(exc, TypeError) and isinstance(exc, RemoteError):
            # A coordinator of this release takes these fields; only an older one has a
            # register_node of another shape.
            raise NodeJoinError(old_coordinator_message(
                address, f"it refused this node's registration: {exc.message}")) from None

    def _key_problem(self, exc: AuthenticationError) -> str:
        """What is wrong with the keys, and how to fix it, for an authentication failure."""
        keys, identity = self.settings.keys_dir, self.settings.identity
        if keys is None:
            return ("it closed the connection during the handshake, so it most likely "
                    "requires CURVE keys and this node has none: join with --keys DIR (the "
                    "directory `actorrl keys generate` made, copied from the coordinator's "
                    "host)")
        if exc.key_refused:
            return (f"it refused this node's key ({keys}/{identity}.public is not on its "
                    "allow-list): copy that file into the coordinator's keys directory and "
                    "restart the coordinator, or join with the keys directory it uses")
        return (f"the CURVE handshake failed ({keys}/coordinator.public is most likely not "
                "the key of the coordinator at that address): copy coordinator.public from "
                "the coordinator's keys directory")

    # ---- staying joined -----------------------------------------------------------------
    async def _heartbeat_until_lost(self, runtime: Runtime) -> None:
        last_ok = time.monotonic()
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.stopping.wait(), self._heartbeat_s)
            if self.stopping.is_set():
                return
            client = self._client
            if client is None or (client.lost is not None and not client.connected):
                client = self._fresh_client(runtime)
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
        if self._client is None or not self.joined.is_set():
            return
        with contextlib.suppress(Exception):
            await self._client.call("coord.leave", [self.node_id], timeout_s=2)

    async def _report_death(self, actor_id: str, reason: str) -> None:
        for _ in range(5):  # acknowledged; retried while this node is registered
            client = self._client
            if client is None or not self.joined.is_set():
                return
            try:
                await client.call("coord.actor_died", [self.node_id, actor_id, reason],
                                  timeout_s=self._heartbeat_timeout_s)
                return
            except Exception as exc:
                log.debug("death report for %s failed: %s", actor_id[:8], exc)
