"""Peers: this process's connections to other processes, and what it knows of them.

:class:`Peers` keeps the cached connection to each endpoint, the endpoints whose process
died (calls to them fail at once), the stores of the owners inside this process (its own,
and those of the actors it hosts in serial mode, whose endpoints are never connected to)
and which endpoints are on this host, so that bulk arrays reach them through shared memory
(:mod:`transport.shm`); it trims the pool of shared-memory segments call arguments are
copied into. Helpers at the end make the
``ipc://`` addresses of a session's processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import tempfile
from types import FrameType
from typing import Any, Protocol

from actorrl.runtime.errors import ActorDiedError
from actorrl.runtime.network import Network
from actorrl.runtime.process.store import ObjectStore
from transport import shm as shm_segments
from transport.codec import Codec
from transport.endpoint import Endpoint, is_composite, short
from transport.errors import PeerLostError
from transport.rpc import RpcClient


class InProcessActor(Protocol):
    """An actor hosted inside this process, on its runtime's loop (serial mode): calls to
    its endpoint are handed to it instead of being sent, and it owns a store of its own."""

    store: ObjectStore

    def accept(self, frames: list[Any], fut: asyncio.Future, caller: FrameType | None
               ) -> None:
        """Run the encoded call ``frames`` (as the runtime sends it): store the result
        under the call's object id in :attr:`store` and resolve ``fut`` with ``[status,
        inline, value]`` (or an ActorDiedError). ``caller``: the frame that submitted the
        call, when it did so on the loop just now (the call may run inline, under it);
        None for a call submitted from another thread (it runs later, from a loop
        callback)."""
        ...


class Peers:
    """The other processes as this one sees them (loop thread only, unless noted).

    ``address``/``store``: this process's own endpoint and store (an object it owns is
    found here, not fetched). The dicts :attr:`clients`, :attr:`dead`, :attr:`stores` and
    :attr:`in_process` are never replaced, so the caller side may hold them directly.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, codec: Codec,
                 network: Network | None, address: str, store: ObjectStore,
                 shm_pool: shm_segments.SegmentPool | None) -> None:
        self.loop = loop
        self.codec = codec
        self.network = network
        self.address = address
        self.shm = shm_pool is not None
        self.shm_pool = shm_pool
        self.clients: dict[str, RpcClient] = {}
        """The cached connection to each endpoint."""
        self.dead: dict[str, str] = {}
        """Endpoints whose process died, with the reason."""
        self.stores: dict[str, ObjectStore] = {address: store}
        """The store of each owner in this process (itself, and the actors in
        :attr:`in_process`), by endpoint: what they own is read here, never fetched."""
        self.in_process: dict[str, InProcessActor] = {}
        """Actors hosted in this process (serial mode), by endpoint."""
        self._shm_routes: dict[str, bool] = {}
        self._shm_trim: asyncio.TimerHandle | None = None
        self.closed = False

    # ---- connections ----------------------------------------------------------------------
    def client(self, endpoint: str) -> RpcClient:
        """The (cached) connection to ``endpoint``."""
        client = self.clients.get(endpoint)
        if client is None or (client.lost is not None):
            if client is not None:
                client.close()
            client = self.connect(endpoint)
            self.clients[endpoint] = client
        return client

    def connection_lost(self, endpoint: str) -> bool:
        """Whether the cached connection to ``endpoint`` saw its peer go (or never reach
        it). A caller about to send a courtesy call skips it then."""
        client = self.clients.get(endpoint)
        return endpoint in self.dead or (client is not None and client.lost is not None)

    def connect(self, endpoint: str, connect_timeout_s: float = 30.0,
                refused_is_lost: bool = False) -> RpcClient:
        """A new, uncached connection to ``endpoint``: ipc to processes of this node,
        CURVE tcp where the endpoint carries a server key, plain otherwise.
        ``refused_is_lost``: see :class:`~transport.rpc.RpcClient` (for probes)."""
        if not is_composite(endpoint):
            return RpcClient(endpoint, codec=self.codec, connect_timeout_s=connect_timeout_s,
                             shm=self.shm, refused_is_lost=refused_is_lost)
        parsed = Endpoint.parse(endpoint)
        network = self.network
        address, server_key = parsed.route(network.node_tag if network else None)
        if server_key is None:
            return RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s,
                             shm=self.shm, refused_is_lost=refused_is_lost)
        security = network.security if network is not None else None
        if security is None:
            client = RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s)
            client._fail_all(PeerLostError(
                f"{parsed.address} needs CURVE keys and this process has none (start it "
                "with a keys directory)"), notify=False)
            return client
        return RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s,
                         curve_keys=security.client_keys(server_key),
                         refused_is_lost=refused_is_lost)

    def traffic(self) -> dict[str, int]:
        """Bytes the open connections have sent and received (shared-memory payloads
        included; connections closed since are not)."""
        clients = self.clients.values()
        return {"bytes_sent": sum(c.bytes_sent for c in clients),
                "bytes_received": sum(c.bytes_received for c in clients)}

    # ---- deaths -----------------------------------------------------------------------------
    def mark_dead(self, endpoint: str, reason: str) -> None:
        """Record that the process at ``endpoint`` died: its pending calls fail now and
        later calls fail at once with ActorDiedError."""
        self.dead[endpoint] = reason
        client = self.clients.pop(endpoint, None)
        if client is not None:
            client.close()
        if self.shm:  # a process of this host may have died holding segments
            shm_segments.sweep_dead_owner_segments()

    def forget_dead(self, endpoint: str) -> None:
        """Allow calls to ``endpoint`` again (a restarted actor reusing it)."""
        self.dead.pop(endpoint, None)

    def died_error(self, endpoint: str, what: str, cause: BaseException | None = None
                   ) -> ActorDiedError:
        """The error of a call to ``what`` at ``endpoint`` that died (``cause``: the
        transport error that said so)."""
        reason = self.dead.get(endpoint) or (str(cause) if cause else "connection lost")
        return ActorDiedError(f"{what} at {short(endpoint)} died: {reason}")

    # ---- actors in this process (serial mode) ---------------------------------------------
    def add_in_process(self, endpoint: str, actor: InProcessActor) -> None:
        """Serve calls to ``endpoint`` (and reads of objects it owns) in this process
        through ``actor``."""
        self.in_process[endpoint] = actor
        self.stores[endpoint] = actor.store
        self.forget_dead(endpoint)

    def remove_in_process(self, endpoint: str, reason: str) -> None:
        """Stop hosting ``endpoint`` here: it is dead from now on (calls to it raise
        ActorDiedError, its objects are lost)."""
        self.in_process.pop(endpoint, None)
        self.stores.pop(endpoint, None)
        self.mark_dead(endpoint, reason)

    # ---- shared memory ----------------------------------------------------------------------
    def shm_to(self, endpoint: str) -> bool:
        """Whether calls to ``endpoint`` send bulk arrays through shared memory (it is
        reached over ipc, so it runs on this host)."""
        found = self._shm_routes.get(endpoint)
        if found is None:
            if not self.shm or endpoint in self.in_process:
                found = False
            elif is_composite(endpoint):
                network = self.network
                found = Endpoint.parse(endpoint).route(
                    network.node_tag if network else None)[0].startswith("ipc://")
            else:
                found = endpoint.startswith("ipc://")
            self._shm_routes[endpoint] = found
        return found

    def trim_later(self) -> None:
        """After a call sent segments: unlink pooled segments once they were idle a while."""
        if self._shm_trim is None:
            self._shm_trim = self.loop.call_later(shm_segments.DEFAULT_POOL_IDLE_S,
                                                  self._trim_shm_pool)

    def _trim_shm_pool(self) -> None:
        """Unlink pooled segments idle for a while; again later while some remain."""
        self._shm_trim = None
        if self.shm_pool is not None and not self.closed and self.shm_pool.trim():
            self._shm_trim = self.loop.call_later(shm_segments.DEFAULT_POOL_IDLE_S,
                                                  self._trim_shm_pool)

    def close(self) -> None:
        """Close every connection and stop trimming."""
        self.closed = True
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        if self._shm_trim is not None:
            self._shm_trim.cancel()


# ---------------------------------------------------------------------- ipc addresses
IPC_FALLBACK_PREFIX = "actorrl-ipc-"
_FALLBACK_MARKER = "for"


def ipc_address(address_dir: str, name: str) -> str:
    """``ipc://`` endpoint for socket ``name`` in ``address_dir``. Unix socket paths are
    limited to 107 bytes, so a long directory falls back to a short private folder under
    the system temp dir (:func:`ipc_fallback_dir`)."""
    path = os.path.join(address_dir, f"{name}.sock")
    if len(path.encode()) > 100:
        path = os.path.join(ipc_fallback_dir(address_dir), f"{name[:40]}.sock")
    return f"ipc://{path}"


def _ipc_root() -> str:
    """Where fallback socket folders go: the temp folder, or ``/tmp`` when ``TMPDIR`` is
    too long for a socket path inside it (a job scheduler's per-job scratch folder)."""
    root = tempfile.gettempdir()
    if len(root.encode()) > 30 and os.path.isdir("/tmp"):
        return "/tmp"
    return root


def ipc_fallback_dir(address_dir: str, create: bool = True) -> str:
    """The short socket folder standing in for ``address_dir``: one per user and
    directory (every process of a session finds the same one), created mode 0700 and
    refused unless this user owns it and no one else may enter it (another user could
    otherwise plant or read sockets there). Removed by :func:`remove_ipc_fallback`."""
    absolute = os.path.abspath(address_dir)
    digest = hashlib.blake2b(absolute.encode(), digest_size=6).hexdigest()
    path = os.path.join(_ipc_root(), f"{IPC_FALLBACK_PREFIX}{os.getuid()}-{digest}")
    if not create:
        return path
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"socket folder {path} is not a private folder of this user (owner uid "
            f"{info.st_uid}, mode {oct(info.st_mode & 0o777)}); remove it, or use a "
            "shorter session directory")
    marker = os.path.join(path, _FALLBACK_MARKER)
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(absolute)
    return path


def remove_ipc_fallback(address_dir: str) -> None:
    """Remove ``address_dir``'s socket folder (when its session ends), and every other
    one of this user whose session directory no longer exists (left by a killed run)."""
    shutil.rmtree(ipc_fallback_dir(address_dir, create=False), ignore_errors=True)
    prefix = f"{IPC_FALLBACK_PREFIX}{os.getuid()}-"
    root = _ipc_root()
    for entry in os.listdir(root):
        if not entry.startswith(prefix):
            continue
        folder = os.path.join(root, entry)
        try:
            with open(os.path.join(folder, _FALLBACK_MARKER)) as f:
                owner_dir = f.read()
        except OSError:
            continue
        if not os.path.isdir(owner_dir):
            shutil.rmtree(folder, ignore_errors=True)


