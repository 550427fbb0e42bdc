"""The per-process runtime: object ownership, calls, get/wait/put/free, and actor hosting.

Every process (driver, coordinator, actor) has exactly one :class:`Runtime`, bound to its
event loop. It serves an RPC endpoint through which other processes fetch the objects it
owns and, in an actor process, call the actor's methods.

There is no process-global runtime: whoever needs one is handed it (the driver's
``runtime``, a handle's runtime, a pipeline's constructor argument). Actor code, which is
built from a class path and cannot be handed anything, asks :meth:`Runtime.current`: the
runtime hosting the method that is running, set by the host for the duration of each call
(a context variable, so it is right in serial mode too, where many actors share a loop).

Protocol (methods served by every runtime):

- ``__call__(object_id, method, args, kwargs)``: run an actor method; the result is stored
  under ``object_id`` here. Reply ``[status, inline, value]``: small values come back inline
  so one round trip suffices, large ones stay here until fetched.
- ``__fetch__(object_id, free)``: reply ``[status, value]`` once the object exists.
- ``__wait__(object_id)``: reply ``status`` once the object exists (no value).
- ``__free__(object_ids)``: notification; drop the objects.
- ``__exit__()``: notification; leave the process.

Same-host bulk data (:mod:`transport.shm`): a runtime's connections to processes of its
host (ipc) send call arguments' big arrays (>= ``shm_threshold``, 256 KiB by default)
through pooled shared-memory segments the caller reuses once the call is answered and the
callee dropped what it read, and answer same-host fetches of stored objects with pooled
segments filled once per array, handed back to the pool when the object is freed.
Segments of a process that died are swept where its death is noticed
(:meth:`Runtime.mark_dead`) and when runtimes start and close. ``ACTORRL_SHM=0`` (or
``Runtime(shm=False)``) turns it off, ``ACTORRL_SHM_THRESHOLD`` (or ``shm_threshold``) sets
the size; across hosts arrays travel as ZeroMQ frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib
import inspect
import itertools
import logging
import os
import queue
import shutil
import stat
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from actorrl.runtime.actor import ActorHandle, _decoding_for
from actorrl.runtime.errors import (
    ActorDiedError,
    GetTimeoutError,
    ObjectLostError,
    RuntimeNotStartedError,
)
from actorrl.runtime.network import Network
from actorrl.runtime.refs import (
    STATUS_ERROR,
    STATUS_OK,
    ObjectRef,
    ObjectStore,
    new_object_id,
)
from transport import shm as shm_segments
from transport.auth import check_bind, ensure_authenticator
from transport.codec import Codec, EncodeError
from transport.endpoint import Endpoint, is_composite, short
from transport.errors import PeerLostError, RemoteError, TransportError
from transport.rpc import Request, RpcClient, RpcServer
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

INLINE_RESULT_BYTES = 16 * 1024
_ready_seq = itertools.count()


def estimate_size(value: Any, budget: int = 256) -> int:
    """A cheap upper-bound-ish estimate of a value's wire size, to decide inlining.

    Walks at most ``budget`` containers/items; anything past the budget counts as large.
    """
    total = 0
    stack = [value]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return 1 << 40
        if isinstance(item, np.ndarray):
            total += item.nbytes
        elif isinstance(item, (bytes, str, bytearray)):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
            total += 8 * len(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "policy_batches"):
            stack.extend(item.policy_batches.values())
        else:
            total += 16
    return total


FREE_DELAY_S = 0.05
"""Frees of garbage-collected refs (and those of ``get_and_free``) wait up to this long;
a request this process sends to the owner meanwhile takes them along (one ZeroMQ message,
see :class:`transport.rpc.Outbox`), so steady traffic sends no free messages of its own
(each message wakes both processes). An explicit ``free`` goes at once."""
FREE_RIDE_AGE_S = 0.005
"""Queued frees ride along with a request once the oldest has waited this long (so a run
of quick calls takes them every few ms, not one free per call)."""
FREE_BATCH = 1024
"""Past this many queued frees they go at once."""
REF_ARGS_TIMEOUT_S = 300.0
"""How long an actor call waits for the values of its ref arguments before it fails."""
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


def ipc_fallback_dir(address_dir: str, create: bool = True) -> str:
    """The short socket folder standing in for ``address_dir``: one per user and
    directory (every process of a session finds the same one), created mode 0700 and
    refused unless this user owns it and no one else may enter it (another user could
    otherwise plant or read sockets there). Removed by :func:`remove_ipc_fallback`."""
    absolute = os.path.abspath(address_dir)
    digest = hashlib.blake2b(absolute.encode(), digest_size=6).hexdigest()
    path = os.path.join(tempfile.gettempdir(), f"{IPC_FALLBACK_PREFIX}{os.getuid()}-{digest}")
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
    root = tempfile.gettempdir()
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


def _raise_for(status: int, value: Any, ref: ObjectRef) -> Any:
    if status == STATUS_OK:
        return value
    if status == STATUS_ERROR:
        if isinstance(value, RemoteError):
            raise value.typed()  # `except ValueError` / `except ActorDiedError` match it
        if isinstance(value, BaseException):
            raise value
        raise RemoteError("Error", str(value))
    raise ObjectLostError(f"{ref!r} does not exist at its owner (freed, or never created)")


class _Call:
    """An actor call received by this process, waiting to run in its caller's submission
    order."""

    __slots__ = ("request", "object_id", "method", "args", "kwargs", "resolution")

    def __init__(self, request: Request, object_id: bytes, method: str, args: list,
                 kwargs: dict) -> None:
        self.request = request
        self.object_id = object_id
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.resolution: asyncio.Future | None = None


@dataclass(frozen=True)
class Hosting:
    """Who runs the actor code executing now: its runtime, and the owner (address and
    store) of the objects that code puts."""

    runtime: Runtime
    address: str
    store: ObjectStore


_hosting: contextvars.ContextVar[Hosting | None] = contextvars.ContextVar(
    "actorrl_hosting", default=None)


def current_hosting() -> Hosting | None:
    """The :class:`Hosting` of the actor method (or constructor) running in this context,
    or None outside actor code."""
    return _hosting.get()


def enter_hosting(hosting: Hosting) -> contextvars.Token:
    """Mark this context as running actor code hosted by ``hosting`` (undo with
    :func:`leave_hosting`)."""
    return _hosting.set(hosting)


def leave_hosting(token: contextvars.Token) -> None:
    """Undo :func:`enter_hosting`."""
    _hosting.reset(token)


def public_method(instance: Any, name: str) -> Callable[..., Any] | RemoteError:
    """The public method ``name`` of a hosted actor, or the error a caller gets when it
    has none (shared by process and serial hosting)."""
    fn = getattr(instance, name, None) if not name.startswith("_") else None
    if fn is None or not callable(fn):
        return RemoteError("AttributeError",
                           f"{type(instance).__qualname__} has no public method {name!r}")
    return fn


def hosted_context(hosting: Hosting) -> contextvars.Context:
    """A copy of the current context in which ``hosting`` is set (for an actor's task)."""
    context = contextvars.copy_context()
    context.run(_hosting.set, hosting)
    return context


class LocalHost(Protocol):
    """An actor hosted inside this process's runtime (serial mode): calls to its endpoint
    are handed to it instead of being sent, and it owns a store of its own."""

    store: ObjectStore

    def accept(self, ref: ObjectRef, frames: list[Any], fut: asyncio.Future) -> None:
        """Run the encoded call ``frames`` (as the runtime sends it); store the result
        under ``ref.id`` in :attr:`store` and resolve ``fut`` with ``[status, inline,
        value]`` (or an ActorDiedError)."""
        ...


class _RuntimeCodec(Codec):
    """The runtime's codec: actor handles it decodes are bound to its runtime."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime

    def decode(self, frames: Sequence[Any], allow_shm: bool = False) -> Any:
        """Decode ``frames``; handles inside submit their calls through this runtime."""
        token = _decoding_for.set(self.runtime)
        try:
            return super().decode(frames, allow_shm)
        finally:
            _decoding_for.reset(token)



_REQUEST_SHAPES: dict[str, tuple[type | tuple[type, ...], ...]] = {
    "__call__": (bytes, str, list, dict),
    "__fetch__": (bytes, bool),
    "__wait__": (bytes,),
    "__free__": (list,),
}
"""The argument types of the runtime's own protocol methods."""


def check_request(method: str, args: list[Any]) -> None:
    """ValueError unless ``args`` fit ``method``'s shape (see :data:`_REQUEST_SHAPES`)."""
    shape = _REQUEST_SHAPES[method]
    if len(args) == len(shape):
        for value, kind in zip(args, shape, strict=True):
            # exact types (what the codec produces): cheap on every call, no bool for int
            if type(value) is not kind:
                break
        else:
            if method == "__call__" and args[3] and not all(
                    type(k) is str for k in args[3]):
                raise ValueError("malformed __call__ request: keyword names must be strings")
            if method == "__free__" and not all(type(i) is bytes for i in args[0]):
                raise ValueError("malformed __free__ request: object ids must be bytes")
            return
    names = ", ".join(t.__name__ for t in shape)  # type: ignore[union-attr]
    raise ValueError(f"malformed {method} request: expected [{names}]")

class Runtime:
    """One process's runtime. Create with :meth:`start` inside a running event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, address_dir: str, name: str,
                 extra_bind: Sequence[str] = (), network: Network | None = None, *,
                 shm: bool | None = None, shm_threshold: int | None = None,
                 server_options: Mapping[str, Any] | None = None) -> None:
        """``shm``: send bulk arrays to same-host processes through shared memory (None:
        unless ``ACTORRL_SHM=0``); ``shm_threshold``: the smallest array in bytes that
        goes so (None: ``ACTORRL_SHM_THRESHOLD``, else 256 KiB); ``server_options``:
        keyword arguments of its :class:`RpcServer` (socket limits such as
        ``max_frame_bytes``, ``max_peers``)."""
        self.loop = loop
        self.loop_thread_id = threading.get_ident()
        self.name = name
        self.codec: Codec = _RuntimeCodec(self)
        if shm is None:
            shm = shm_segments.enabled_by_env()
        if shm and not shm_segments.available():
            shm_segments.warn_fallback(OSError(f"{shm_segments.SHM_DIR} is not writable"))
            shm = False
        self.shm = shm
        """Whether bulk arrays to same-host processes go through shared memory."""
        if shm_threshold is None:
            shm_threshold = int(os.environ.get("ACTORRL_SHM_THRESHOLD",
                                               shm_segments.DEFAULT_THRESHOLD))
        self.shm_threshold = shm_threshold
        self.shm_calls = shm
        """Whether call arguments use shared memory (set False to send them as ZeroMQ
        frames, e.g. to compare; fetch replies are unaffected)."""
        self.shm_pool = shm_segments.SegmentPool() if shm else None
        """Segments call arguments are copied into (reused)."""
        self._shm_objects: dict[bytes, dict] = {}
        """Segments placed for stored objects fetched by same-host processes, by id."""
        self._shm_routes: dict[str, bool] = {}
        self._shm_trim: asyncio.TimerHandle | None = None
        self._encoded_objects: dict[bytes, list[Any]] = {}
        """Fetch replies of stored objects fetched without freeing, encoded once, by id:
        an object many processes fetch (a weights version) is serialised once."""
        self.store = ObjectStore(loop, on_drop=self._drop_object)
        self.network = network
        self.server = RpcServer(self._on_request, codec=self.codec, **(server_options or {}))
        self.local_address = self.server.bind(ipc_address(address_dir, name))
        self.address = self.local_address
        """The endpoint other processes use (refs and handles carry it)."""
        security = network.security if network is not None else None
        if security is not None:
            ensure_authenticator(security.allowed, security.roles)
        if network is not None and network.host is not None:
            tcp = self.server.bind(network.tcp_bind_address(),
                                   security.identity.secret if security else None)
            self.address = str(Endpoint(
                tcp, security.identity.public if security else None, network.node_tag,
                self.local_address if network.node_tag else None))
        for address in extra_bind:
            check_bind(address, security, network is not None and network.insecure_loopback)
            self.server.bind(address, security.identity.secret if security else None)
        self._clients: dict[str, RpcClient] = {}
        self._dead: dict[str, str] = {}
        self._frees: deque[tuple[str, bytes]] = deque()
        self._free_flush_scheduled = False
        self._free_timer_armed = False
        self._frees_since = 0.0
        """Loop time when the queued frees started to wait (about: set from any thread)."""
        self.actor: Any = None
        self._calls: dict[bytes, deque[_Call]] = {}
        """Calls not started yet, per caller (the connection they came on)."""
        self._pumping: set[bytes] = set()
        self._executor: _ActorExecutor | None = None
        self._local_hosts: dict[str, LocalHost] = {}
        self.exit_event = asyncio.Event()
        self.on_actor_died: list[Callable[[str, str], None]] = []
        self.closed = False

    @property
    def bytes_received(self) -> int:
        """Bytes this process received: requests at its server and replies on every
        cached connection (arrays read through shared memory included)."""
        return self.server.bytes_received + sum(c.bytes_received for c in self._clients.values())

    @property
    def pending_frees(self) -> int:
        """Frees of collected refs queued here, not sent to their owners yet."""
        return len(self._frees)

    @property
    def executor(self) -> _ActorExecutor | None:
        """The thread running the hosted actor's synchronous methods (None before
        :meth:`host_actor`)."""
        return self._executor

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start(cls, address_dir: str, name: str, extra_bind: Sequence[str] = (),
              network: Network | None = None, *,
              server_options: Mapping[str, Any] | None = None) -> Runtime:
        """Create a runtime on the running loop and start serving; the caller owns it and
        hands it to whatever needs it.

        With ``network`` it also binds tcp (see :mod:`actorrl.runtime.network`) and
        :attr:`address` becomes an endpoint reachable from other nodes.
        """
        runtime = cls(asyncio.get_running_loop(), address_dir, name, extra_bind, network,
                      server_options=server_options)
        runtime.server.start()
        if runtime.shm:
            shm_segments.sweep_dead_owner_segments()
        return runtime

    @classmethod
    def current(cls) -> Runtime:
        """For actor code: the runtime hosting the actor method (or constructor) that is
        running, e.g. to ``put`` a result or ``await get_async`` refs it was handed.

        Not a process-global: the host sets it for the duration of each call (and it
        follows the call into ``asyncio.to_thread``); anywhere else it raises. Code outside
        actors is handed its runtime (``driver.runtime``, ``handle.runtime``)."""
        hosting = _hosting.get()
        if hosting is None or hosting.runtime.closed:
            raise RuntimeNotStartedError(
                "Runtime.current() is for actor code (it names the runtime hosting the "
                "running actor method); elsewhere use the runtime you were given "
                "(driver.runtime, handle.runtime)")
        return hosting.runtime

    def hosting(self) -> Hosting:
        """This runtime as the host of its process's actor (what its methods put is owned
        by this process)."""
        return Hosting(self, self.address, self.store)

    def close(self) -> None:
        """Close every socket; pending calls fail."""
        if self.closed:
            return
        self._flush_frees()
        self.closed = True
        if self._executor is not None:
            self._executor.stop()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.server.close()
        if self._shm_trim is not None:
            self._shm_trim.cancel()
        if self.shm_pool is not None:
            self.shm_pool.close()
            for cache in self._shm_objects.values():
                shm_segments.StoredPlacer.release(cache)  # unlinked: the pool is closed
            self._shm_objects.clear()
            shm_segments.sweep_dead_owner_segments()

    def on_loop(self) -> bool:
        """True when called from this runtime's event-loop thread."""
        return threading.get_ident() == self.loop_thread_id

    def before_loop_request(self) -> None:
        """Called off the loop before anything that may make another process fetch this
        one's objects (a call, a get, a free): objects an actor method put are stored first
        (the loop runs callbacks in order)."""
        executor = self._executor
        if executor is not None and executor.pending_puts:
            self.loop.call_soon_threadsafe(executor.flush_puts)

    # ------------------------------------------------------------------ connections
    def traffic(self) -> dict[str, int]:
        """Bytes this runtime's server and its open client connections have sent and
        received (shared-memory payloads included; connections closed since are not)."""
        conns = [self.server, *self._clients.values()]
        return {"bytes_sent": sum(c.bytes_sent for c in conns),
                "bytes_received": sum(c.bytes_received for c in conns)}

    def client(self, endpoint: str) -> RpcClient:
        """The (cached) connection to ``endpoint``; loop thread only."""
        client = self._clients.get(endpoint)
        if client is None or (client.lost is not None):
            if client is not None:
                client.close()
            client = self.connect(endpoint)
            self._clients[endpoint] = client
        return client

    def connection_lost(self, endpoint: str) -> bool:
        """Whether the cached connection to ``endpoint`` saw its peer go (or never reach
        it); loop thread only. A caller about to send a courtesy call skips it then."""
        client = self._clients.get(endpoint)
        return endpoint in self._dead or (client is not None and client.lost is not None)

    def connect(self, endpoint: str, connect_timeout_s: float = 30.0) -> RpcClient:
        """A new, uncached connection to ``endpoint``: ipc to processes of this node,
        CURVE tcp where the endpoint carries a server key, plain otherwise."""
        if not is_composite(endpoint):
            return RpcClient(endpoint, codec=self.codec, connect_timeout_s=connect_timeout_s,
                             shm=self.shm)
        parsed = Endpoint.parse(endpoint)
        network = self.network
        address, server_key = parsed.route(network.node_tag if network else None)
        if server_key is None:
            return RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s,
                             shm=self.shm)
        security = network.security if network is not None else None
        if security is None:
            client = RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s)
            client._fail_all(PeerLostError(
                f"{parsed.address} needs CURVE keys and this process has none (start it "
                "with a keys directory)"), notify=False)
            return client
        return RpcClient(address, codec=self.codec, connect_timeout_s=connect_timeout_s,
                         curve_keys=security.client_keys(server_key))

    def mark_dead(self, endpoint: str, reason: str) -> None:
        """Record that the process at ``endpoint`` died: its pending calls fail now and
        later calls fail at once with ActorDiedError."""
        self._dead[endpoint] = reason
        client = self._clients.pop(endpoint, None)
        if client is not None:
            client.close()
        if self.shm:  # a process of this host may have died holding segments
            shm_segments.sweep_dead_owner_segments()

    def shm_to(self, endpoint: str) -> bool:
        """Whether calls to ``endpoint`` send bulk arrays through shared memory (it is
        reached over ipc, so it runs on this host)."""
        found = self._shm_routes.get(endpoint)
        if found is None:
            if not self.shm or endpoint in self._local_hosts:
                found = False
            elif is_composite(endpoint):
                network = self.network
                found = Endpoint.parse(endpoint).route(
                    network.node_tag if network else None)[0].startswith("ipc://")
            else:
                found = endpoint.startswith("ipc://")
            self._shm_routes[endpoint] = found
        return found

    def _trim_shm_pool(self) -> None:
        """Unlink pooled segments idle for a while; again later while some remain."""
        self._shm_trim = None
        if self.shm_pool is not None and not self.closed and self.shm_pool.trim():
            self._shm_trim = self.loop.call_later(shm_segments.DEFAULT_POOL_IDLE_S,
                                                  self._trim_shm_pool)

    def _drop_object(self, object_id: bytes) -> None:
        self._encoded_objects.pop(object_id, None)
        cache = self._shm_objects.pop(object_id, None)
        if cache:
            shm_segments.StoredPlacer.release(cache, self.shm_pool)

    def forget_dead(self, endpoint: str) -> None:
        """Allow calls to ``endpoint`` again (a restarted actor reusing it)."""
        self._dead.pop(endpoint, None)

    def _died_error(self, endpoint: str, what: str, cause: BaseException | None = None
                    ) -> ActorDiedError:
        reason = self._dead.get(endpoint) or (str(cause) if cause else "connection lost")
        return ActorDiedError(f"{what} at {short(endpoint)} died: {reason}")

    # ------------------------------------------------------------------ calls (caller side)
    def submit(self, handle: ActorHandle, method: str, args: Sequence[Any],
               kwargs: dict[str, Any]) -> ObjectRef:
        """Submit ``handle.method(*args, **kwargs)``; returns the result's ref at once.

        Encoding happens here, in the caller's thread, so unsupported argument types fail
        immediately; sending happens on the loop.
        """
        object_id = new_object_id()
        ref = ObjectRef(object_id, handle.endpoint)
        ref._runtime = self
        ref._tracked = True
        pinned = [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef)]
        escaped = [a._escaped for a in pinned]
        body = ["__call__", [object_id, method, list(args), kwargs], {}]
        placer = None
        if self.shm_calls and self.shm_pool is not None and self.shm_to(handle.endpoint):
            placer = shm_segments.CallPlacer(self.shm_pool, self.shm_threshold)
            try:
                frames = self.codec.encode(body, placer)
            except BaseException:
                placer.finish(False)
                raise
            if not placer.segments and not placer.keep:
                placer = None
        else:
            frames = self.codec.encode(body)
        for arg, was_escaped in zip(pinned, escaped):
            arg._escaped = was_escaped  # passed as a direct argument: kept alive below
        ref._pinned = pinned or None
        if self.on_loop():
            self._send_call(ref, handle, frames, placer)
        else:
            self.before_loop_request()
            ref._future = _PendingFuture()
            self.loop.call_soon_threadsafe(self._send_call, ref, handle, frames, placer)
        return ref

    def _send_call(self, ref: ObjectRef, handle: ActorHandle, frames: list[Any],
                   placer: shm_segments.CallPlacer | None = None) -> None:
        placeholder = ref._future
        fut = _CallFuture(self, ref, handle)
        ref._future = fut
        if placeholder is not None:
            placeholder.resolve(fut)
        if handle.endpoint in self._dead:
            fut.set_exception(self._died_error(handle.endpoint, repr(handle)))
        elif self.closed:
            fut.set_exception(ActorDiedError("the runtime is shut down"))
        else:
            host = self._local_hosts.get(handle.endpoint)
            if host is not None:  # serial mode: the actor lives here; the call may run now
                host.accept(ref, frames, fut)
                return
            if self._frees:
                self._frees_ride_with(handle.endpoint)
            try:  # the reply (or the connection's loss) resolves fut itself
                self.client(handle.endpoint).call_encoded(frames, placer=placer, future=fut)
            except Exception as exc:  # a full send queue, a bad endpoint: the call failed
                fut.set_exception(exc)
            else:
                if placer is not None and self._shm_trim is None:
                    self._shm_trim = self.loop.call_later(
                        shm_segments.DEFAULT_POOL_IDLE_S, self._trim_shm_pool)
                placer = None  # released by the reply
        if placer is not None:
            placer.finish(False)

    # ------------------------------------------------------------------ get / wait / put / free
    async def get_async(self, ref: ObjectRef | Sequence[ObjectRef],
                        timeout_s: float | None = None) -> Any:
        """Resolve one ref or a list of refs (raises the remote error, ActorDiedError, or
        GetTimeoutError)."""
        if isinstance(ref, ObjectRef):
            coro = self._get_one(ref)
        else:
            coro = asyncio.gather(*(self._get_one(r) for r in ref))
        if timeout_s is None:
            return await coro
        try:
            return await wait_for(coro, timeout_s)
        except TimeoutError as exc:
            if isinstance(exc, RemoteError):  # the method itself timed out: not this get
                raise
            raise GetTimeoutError(f"get timed out after {timeout_s:g} s") from None

    def add_local_host(self, endpoint: str, host: LocalHost) -> None:
        """Serve calls to ``endpoint`` (and fetches of objects it owns) in this process
        through ``host`` (serial mode)."""
        self._local_hosts[endpoint] = host
        self.forget_dead(endpoint)

    def remove_local_host(self, endpoint: str, reason: str) -> None:
        """Stop hosting ``endpoint`` here: it is dead from now on (calls to it raise
        ActorDiedError, its objects are lost)."""
        self._local_hosts.pop(endpoint, None)
        self.mark_dead(endpoint, reason)

    def _local_store(self, owner: str) -> ObjectStore | None:
        """The store holding what ``owner`` owns, when that is in this process."""
        if owner == self.address:
            return self.store
        host = self._local_hosts.get(owner)
        return host.store if host is not None else None

    async def _get_one(self, ref: ObjectRef) -> Any:
        store = self._local_store(ref.owner)
        if store is not None:
            found = store.lookup(ref.id)
            if found is None:
                fut = self.loop.create_future()
                store.when_ready(ref.id, lambda s, v: fut.done() or fut.set_result((s, v)))
                found = await fut
            return _raise_for(found[0], found[1], ref)
        if ref._has_value:
            return _raise_for(*ref._value, ref)
        if ref._future is not None:
            fut = ref._future
            if isinstance(fut, _PendingFuture):
                fut = await fut.wait()
            # A caller's timeout or cancel must not cancel the call itself, which later
            # gets of this ref still need. Raises ActorDiedError / transport errors.
            if not fut.done():
                await fut.wait_done()
            fut.result()
            if ref._has_value:
                return _raise_for(*ref._value, ref)
        # One fetch per ref however many gets wait on it, shielded so a get that times out
        # leaves it running for the others (and the owner sends the value once).
        if ref._fetching is None:
            ref._fetching = self.loop.create_task(self._fetch(ref, free=False))
        status, value = await asyncio.shield(ref._fetching)
        ref._value = (status, value)
        ref._has_value = True
        ref._fetching = None
        return _raise_for(status, value, ref)

    async def _fetch(self, ref: ObjectRef, free: bool) -> tuple[int, Any]:
        if ref.owner in self._dead:
            raise ObjectLostError(str(self._died_error(ref.owner, f"owner of {ref!r}")))
        if self._frees:  # always: this process's later reads see its earlier frees
            self._flush_frees(ref.owner)
        try:
            status, value = await self.client(ref.owner).call("__fetch__", [ref.id, free])
        except (PeerLostError, TransportError) as exc:
            raise ObjectLostError(
                str(self._died_error(ref.owner, f"owner of {ref!r}", exc))) from None
        return status, value

    def call_error(self, ref: ObjectRef) -> BaseException | None:
        """For a finished call this process submitted: the error that ended it without a
        result (e.g. ActorDiedError), else None. Never fetches the value."""
        fut = ref._future
        if fut is None or isinstance(fut, _PendingFuture) or not fut.done():
            return None
        return None if fut.cancelled() else fut.exception()

    def on_ready(self, ref: ObjectRef, callback: Callable[[], None]) -> None:
        """Call ``callback()`` on the loop once ``ref`` is ready (value or error)."""
        self._readiness(ref)[0].add_done_callback(lambda _f: callback())

    def _readiness(self, ref: ObjectRef) -> tuple[asyncio.Future, Callable[[], None]]:
        """A future done when ``ref`` is ready (value or error; it never raises), and a
        function that removes every hook it left, for when nobody waits any more (so
        repeated waits on a pending ref leak nothing)."""
        fut = self.loop.create_future()

        def done(*_: Any) -> None:
            if not fut.done():
                fut.set_result(None)

        def watch(source: asyncio.Future) -> Callable[[], None]:
            source.add_done_callback(done)
            return lambda: source.remove_done_callback(done)

        store = self._local_store(ref.owner)
        if store is not None and ref._future is None:  # owned here, not a call of ours
            store.when_ready(ref.id, done)
            return fut, lambda: store.remove_waiter(ref.id, done)
        if ref._has_value:
            done()
            return fut, lambda: None
        if ref._future is not None and not isinstance(ref._future, _PendingFuture):
            return fut, watch(ref._future)
        # A ref this process did not submit (or whose send is still queued): one shared
        # readiness task per ref, however often it is waited on.
        if ref._wait is None:
            ref._wait = self.loop.create_task(self._remote_ready(ref))
        return fut, watch(ref._wait)

    async def _remote_ready(self, ref: ObjectRef) -> None:
        if ref.owner in self._dead:
            return  # ready: a get raises ObjectLostError at once
        if isinstance(ref._future, _PendingFuture):
            inner = await ref._future.wait()
            await asyncio.wait([inner])
            return
        if self._frees:
            self._flush_frees(ref.owner)
        with contextlib.suppress(Exception):  # an error also means "ready" (get raises it)
            await self.client(ref.owner).call("__wait__", [ref.id])

    async def wait_async(self, refs: Sequence[ObjectRef], num_returns: int = 1,
                         timeout_s: float | None = None
                         ) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """Wait until ``num_returns`` of ``refs`` are ready or ``timeout_s`` passes.

        Returns ``(ready, not_ready)``; ``ready`` is in the order the refs became ready,
        ``not_ready`` keeps the input order. A ref whose call failed counts as ready.
        """
        refs = list(refs)
        if num_returns > len(refs):
            raise ValueError(f"num_returns={num_returns} exceeds the {len(refs)} refs given")
        if len(set(refs)) != len(refs):
            raise ValueError("wait() got duplicate refs")
        order: list[ObjectRef] = []
        enough = self.loop.create_future()
        futures = []
        cleanups = []
        for ref in refs:
            rf, cleanup = self._readiness(ref)
            futures.append(rf)
            cleanups.append(cleanup)

            def on_ready(_f: asyncio.Future, r: ObjectRef = ref) -> None:
                order.append(r)
                if len(order) >= num_returns and not enough.done():
                    enough.set_result(None)

            rf.add_done_callback(on_ready)
        if num_returns == 0:
            enough.set_result(None)
        # Callbacks of futures that were already done run on the next loop iteration.
        try:
            await asyncio.sleep(0)
            if not enough.done():
                try:
                    await wait_for(asyncio.shield(enough), timeout_s)
                except TimeoutError:
                    pass
        finally:  # also when the waiter is cancelled: no hooks left behind
            for rf, cleanup in zip(futures, cleanups):
                if not rf.done():
                    cleanup()
                    rf.cancel()
        # Refs that were already complete before the wait sort by completion order.
        ready = sorted(order, key=lambda r: (r._ready_seq < 0, r._ready_seq))
        ready = ready[: max(num_returns, 0)] if len(ready) > num_returns else ready
        ready_ids = {r.id for r in ready}
        return ready, [r for r in refs if r.id not in ready_ids]

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` in this process and return a ref others can fetch (thread-safe).

        Called by actor code of a serial-mode actor, the object is owned by that actor
        (it is lost when the actor dies), as it would be in the actor's own process."""
        hosting = _hosting.get()
        if hosting is not None and hosting.runtime is self and hosting.store is not self.store:
            return self._put_in(hosting, value)
        ref = ObjectRef(new_object_id(), self.address)
        ref._runtime = self
        ref._tracked = True
        ref._value = (STATUS_OK, value)
        ref._has_value = True
        ref._ready_seq = next(_ready_seq)
        executor = self._executor
        if self.on_loop():
            self.store.set(ref.id, STATUS_OK, value)
        elif executor is not None and executor.running_here():
            # Inside an actor method: stored when the method's result reaches the loop
            # (before the result is replied), which saves a loop wake-up per put.
            executor.pending_puts.append((ref.id, value))
        else:
            self.loop.call_soon_threadsafe(self.store.set, ref.id, STATUS_OK, value)
        return ref

    def _put_in(self, hosting: Hosting, value: Any) -> ObjectRef:
        ref = ObjectRef(new_object_id(), hosting.address)
        ref._runtime = self
        ref._tracked = True
        ref._ready_seq = next(_ready_seq)
        if self.on_loop():
            hosting.store.set(ref.id, STATUS_OK, value)
        else:
            self.loop.call_soon_threadsafe(hosting.store.set, ref.id, STATUS_OK, value)
        return ref

    def free(self, refs: ObjectRef | Iterable[ObjectRef], soon: bool = True) -> None:
        """Release objects at their owners now (thread-safe); ``soon=False``: within
        :data:`FREE_DELAY_S`, with the next request to the owner."""
        if isinstance(refs, ObjectRef):
            refs = [refs]
        if not self.on_loop():
            self.before_loop_request()
        for ref in refs:
            ref._freed = True
            ref._value = None
            ref._has_value = False
            self.release(ref.owner, ref.id, soon)

    async def get_and_free_async(self, refs: ObjectRef | Sequence[ObjectRef],
                                 timeout_s: float | None = None) -> Any:
        """Get, then free at the owner (like RLlib's ``ray_get_and_free``); the frees go
        with the next request to each owner, or within :data:`FREE_DELAY_S`."""
        try:
            return await self.get_async(refs, timeout_s)
        finally:
            self.free(refs, soon=False)

    def release(self, owner: str, object_id: bytes, soon: bool = True) -> None:
        """Queue a free of ``object_id`` at ``owner``; batched, any thread. ``soon``:
        send it in the next loop iteration; otherwise (a ref that was garbage-collected, a
        ``get_and_free``) with the next request to ``owner`` or within
        :data:`FREE_DELAY_S`, together with the others of that time."""
        frees = self._frees
        if not frees:
            self._frees_since = self.loop.time()
        frees.append((owner, object_id))
        if self._free_flush_scheduled or self.closed:
            return
        if soon or len(frees) >= FREE_BATCH:
            self._free_flush_scheduled = True
            if self.on_loop():
                self.loop.call_soon(self._flush_frees)
            else:
                self.loop.call_soon_threadsafe(self._flush_frees)
        elif not self._free_timer_armed:
            self._free_timer_armed = True
            if self.on_loop():
                self.loop.call_later(FREE_DELAY_S, self._free_timer_fired)
            else:
                self.loop.call_soon_threadsafe(self.loop.call_later, FREE_DELAY_S,
                                               self._free_timer_fired)

    def _free_timer_fired(self) -> None:
        self._free_timer_armed = False
        if not self.closed:
            self._flush_frees()

    def _frees_ride_with(self, owner: str) -> None:
        """Before a call to ``owner``: its queued frees go in the same message, once they
        waited :data:`FREE_RIDE_AGE_S` (or many are queued). (Before a fetch or wait they
        always do.)"""
        if (len(self._frees) >= FREE_BATCH // 16
                or self.loop.time() - self._frees_since >= FREE_RIDE_AGE_S):
            self._flush_frees(owner)

    def _flush_frees(self, only: str | None = None) -> None:
        """Send the queued frees (``only``: those of that owner, just before a request
        to it, so they travel in the same ZeroMQ message)."""
        if only is None:
            self._free_flush_scheduled = False
        by_owner: dict[str, list[bytes]] = {}
        others = []
        frees = self._frees
        while frees:  # popleft: other threads may append meanwhile
            owner, object_id = frees.popleft()
            if only is None or owner == only:
                by_owner.setdefault(owner, []).append(object_id)
            else:
                others.append((owner, object_id))
        if others:
            frees.extend(others)
            self._frees_since = self.loop.time()
        for owner, ids in by_owner.items():
            store = self._local_store(owner)
            if store is not None:
                for object_id in ids:
                    store.free(object_id)
            elif owner not in self._dead and not self.closed:
                try:
                    # Before a request: held, so both travel in one message.
                    self.client(owner).notify("__free__", [ids], hold=only is not None)
                except Exception as exc:  # a free is best effort
                    log.debug("could not send free to %s: %s", owner, exc)

    # ------------------------------------------------------------------ serving
    def _on_request(self, request: Request) -> None:
        method = request.method
        if method in _REQUEST_SHAPES:
            # Checked before any state changes: a malformed request gets an error reply
            # (it used to raise later, in a loop callback, leaving its object pending).
            check_request(method, request.args)
        if method == "__call__":
            self._on_actor_call(request)
        elif method == "__fetch__":
            object_id, free = request.args

            def send(status: int, value: Any) -> None:
                if (request.local and not free and status == STATUS_OK and self.shm
                        and self.store.lookup(object_id) is not None):
                    # A same-host fetch: big arrays go as segments placed once per object
                    # (unlinked when it is freed), never before it is freed.
                    cache = self._shm_objects.setdefault(object_id, {})
                    request.reply([status, value], shm_segments.StoredPlacer(
                        cache, self.shm_threshold, self.shm_pool))
                    if not cache:
                        del self._shm_objects[object_id]
                elif not free and status == STATUS_OK and \
                        self.store.lookup(object_id) is not None:
                    self._reply_stored(request, object_id, value)
                else:
                    request.reply([status, value])
                if free:
                    self.store.free(object_id)

            self.store.when_ready(object_id, send)
        elif method == "__wait__":
            self.store.when_ready(request.args[0], lambda s, v: request.reply(s))
        elif method == "__free__":
            for object_id in request.args[0]:
                self.store.free(object_id)
        elif method == "__ping__":
            request.reply(self.name)
        elif method == "__exit__":
            self.exit_event.set()
        elif method in self.extra_handlers:
            self.extra_handlers[method](request)
        else:
            raise ValueError(f"unknown runtime method {method!r}")

    def _reply_stored(self, request: Request, object_id: bytes, value: Any) -> None:
        """Reply to a fetch that keeps the object with its encoding, made at the first such
        fetch and kept until the object is freed."""
        frames = self._encoded_objects.get(object_id)
        if frames is None:
            try:
                frames = self.codec.encode([STATUS_OK, value])
            except EncodeError:
                request.reply([STATUS_OK, value])  # replies with the encoding error
                return
            self._encoded_objects[object_id] = frames
        request.reply_encoded(frames)

    extra_handlers: dict[str, Callable[[Request], None]] = {}

    def serve(self, method: str, handler: Callable[[Request], None]) -> None:
        """Serve an extra protocol method (used by nodes and the coordinator)."""
        self.extra_handlers = {**self.extra_handlers, method: handler}

    # ------------------------------------------------------------------ actor hosting
    def host_actor(self, instance: Any) -> None:
        """Make this process serve ``instance``'s public methods (its synchronous ones in
        an executor thread, its coroutines as tasks on the loop; both see this runtime as
        :meth:`current`)."""
        self.actor = instance
        self._executor = _ActorExecutor(self)

    def _on_actor_call(self, request: Request) -> None:
        object_id, method, args, kwargs = request.args
        if self.actor is None:
            raise ValueError(f"{self.name} hosts no actor; cannot call {method!r}")
        self.store.add_pending(object_id)
        call = _Call(request, object_id, method, args, kwargs)
        refs = [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef)]
        if refs:
            call.resolution = self.loop.create_task(self._resolve_args(call))
        self._calls.setdefault(request.peer, deque()).append(call)
        self._pump(request.peer)

    async def _resolve_args(self, call: _Call) -> None:
        """Replace ``call``'s ref arguments by their values, within
        :data:`REF_ARGS_TIMEOUT_S` (a missing object or a slow owner fails this call
        only, with an error that says so)."""
        async def resolve(value: Any) -> Any:
            return await self._get_one(value) if isinstance(value, ObjectRef) else value

        async def resolve_all() -> None:
            call.args = list(await asyncio.gather(*(resolve(a) for a in call.args)))
            for key, value in call.kwargs.items():
                call.kwargs[key] = await resolve(value)

        try:
            await wait_for(resolve_all(), REF_ARGS_TIMEOUT_S)
        except TimeoutError:
            raise GetTimeoutError(
                f"the ref arguments of {call.method}() were not available within "
                f"{REF_ARGS_TIMEOUT_S:g} s (their owner is slow or gone)") from None

    def _pump(self, caller: bytes) -> None:
        """Start ``caller``'s calls in its submission order. A call waiting for its ref
        arguments holds back that caller's later calls only: other callers go on."""
        if caller in self._pumping:
            return
        self._pumping.add(caller)
        try:
            queue = self._calls.get(caller)
            while queue:
                call = queue[0]
                if call.resolution is not None and not call.resolution.done():
                    call.resolution.add_done_callback(lambda _f, c=caller: self._pump(c))
                    return
                queue.popleft()
                self._start(call)
            self._calls.pop(caller, None)
        finally:
            self._pumping.discard(caller)

    def _start(self, call: _Call) -> None:
        if call.resolution is not None and call.resolution.exception() is not None:
            self._finish(call, STATUS_ERROR, RemoteError.from_exception(
                call.resolution.exception()))
            return
        fn = public_method(self.actor, call.method)
        if isinstance(fn, RemoteError):
            self._finish(call, STATUS_ERROR, fn)
            return
        if inspect.iscoroutinefunction(fn):
            try:  # bad arguments raise here, before a coroutine exists
                coro = fn(*call.args, **call.kwargs)
            except Exception as exc:
                self._finish(call, STATUS_ERROR, RemoteError.from_exception(exc))
                return
            task = self.loop.create_task(coro, context=hosted_context(self.hosting()))
            task.add_done_callback(lambda t, c=call: self._finish_task(c, t))
        else:
            assert self._executor is not None
            self._executor.submit(call, fn)

    def _finish_task(self, call: _Call, task: asyncio.Task) -> None:
        if task.cancelled():
            self._finish(call, STATUS_ERROR, RemoteError("CancelledError", "call cancelled"))
        elif task.exception() is not None:
            self._finish(call, STATUS_ERROR, RemoteError.from_exception(task.exception()))
        else:
            self._finish(call, STATUS_OK, task.result())

    def _finish(self, call: _Call, status: int, value: Any) -> None:
        self.store.set(call.object_id, status, value)
        inline = status != STATUS_OK or estimate_size(value) <= INLINE_RESULT_BYTES
        call.request.reply([status, inline, value if inline else None])


class _CallFuture(asyncio.Future):
    """The future of a call this process sent, resolved by its reply directly (no relay
    future in between, so a get resumes one loop iteration after the reply is read).

    A transport error (the actor's connection lost, a deadline) is set as the
    ActorDiedError a caller sees, with the transport error as its ``__cause__``; the ref
    gets an inline value the moment the reply sets it; and gets wait on waiters of their
    own (:meth:`wait_done`), so one that gives up never cancels the call."""

    def __init__(self, runtime: Runtime, ref: ObjectRef, handle: ActorHandle) -> None:
        super().__init__(loop=runtime.loop)
        self._runtime: Runtime | None = runtime
        self._ref: ObjectRef | None = ref  # a cycle with ref._future until the call ends
        self._handle = handle
        self._waiters: list[asyncio.Future] | None = None

    def set_result(self, result: Any) -> None:
        """Resolve with the reply ``[status, inline, value]``."""
        super().set_result(result)
        ref = self._ref
        if ref is not None and type(result) is list and len(result) == 3 and result[1]:
            ref._value = (result[0], result[2])
            ref._has_value = True
        self._settle()

    def set_exception(self, exception: Any) -> None:
        """Fail the call; a transport error becomes an ActorDiedError."""
        runtime = self._runtime
        if isinstance(exception, TransportError) and runtime is not None:
            died = runtime._died_error(self._handle.endpoint, repr(self._handle), exception)
            died.__cause__ = exception
            exception = died
        super().set_exception(exception)
        # Retrieved here: the ref reports the failure to whoever gets it, and a call whose
        # ref nobody gets (fire and forget, or dropped) failing with its dead actor is no
        # error for asyncio to log ("exception was never retrieved") when it is collected.
        super().exception()
        self._settle()

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the call's future (nothing in the runtime does)."""
        if not super().cancel(msg):
            return False
        self._settle()
        return True

    def _settle(self) -> None:
        ref, self._ref, self._runtime = self._ref, None, None
        if ref is not None:
            ref._ready_seq = next(_ready_seq)
            ref._pinned = None
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_done(self) -> None:
        """Return once the call ended (its result is then here); cancelling this wait
        leaves the call running."""
        if self.done():
            return
        waiter = self.get_loop().create_future()
        if self._waiters is None:
            self._waiters = [waiter]
        else:
            self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() and self._waiters is not None:
                self._waiters.remove(waiter)


class _PendingFuture:
    """Stands in for a call's future between a cross-thread submit and its send."""

    __slots__ = ("_inner", "_event")

    def __init__(self) -> None:
        self._inner: asyncio.Future | None = None
        self._event: asyncio.Event | None = None

    def resolve(self, inner: asyncio.Future) -> None:
        self._inner = inner
        if self._event is not None:
            self._event.set()

    async def wait(self) -> asyncio.Future:
        if self._inner is None:
            if self._event is None:  # shared by every waiter (a get and a wait, say)
                self._event = asyncio.Event()
            await self._event.wait()
        assert self._inner is not None
        return self._inner


class _ActorExecutor:
    """One thread that runs an actor's synchronous methods, one at a time, in order, so the
    event loop never blocks. Results are handed back to the loop in batches."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._incoming: list[tuple[_Call, Callable[..., Any]]] = []
        self._handover_scheduled = False
        self._done: deque[tuple[_Call, int, Any]] = deque()
        self.pending_puts: deque[tuple[bytes, Any]] = deque()
        self._lock = threading.Lock()
        self._wake_scheduled = False
        self.after_flush_puts: Callable[[], None] | None = None
        """Test hook: runs on the loop after each :meth:`flush_puts`, to force the race of
        a method finishing while an earlier result is being delivered."""
        self._thread = threading.Thread(target=self._run, name="actor-executor", daemon=True)
        self._thread.start()

    def submit(self, call: _Call, fn: Callable[..., Any]) -> None:
        """Run ``fn`` for ``call`` after the calls submitted before it (on the loop).

        The calls started in one loop iteration are handed to the thread together at its
        end: one wake-up of the thread per burst, made when the loop is about to let go of
        the GIL (a thread woken earlier would wake again to wait for it)."""
        self._incoming.append((call, fn))
        if not self._handover_scheduled:
            self._handover_scheduled = True
            self.runtime.loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._handover_scheduled = False
        if self._incoming:
            batch, self._incoming = self._incoming, []
            self._queue.put(batch)

    def stop(self) -> None:
        self._hand_over()
        self._queue.put(None)

    def _run(self) -> None:
        _hosting.set(self.runtime.hosting())  # this thread runs only the actor's methods
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            for call, fn in batch:
                try:
                    status, value = STATUS_OK, fn(*call.args, **call.kwargs)
                except BaseException as exc:
                    status, value = STATUS_ERROR, RemoteError.from_exception(exc)
                try:
                    self.hand_back(call, status, value)
                except RuntimeError:  # loop closed during shutdown
                    return

    def hand_back(self, call: _Call, status: int, value: Any) -> None:
        """Hand a finished call's result to the loop (from any thread): results are
        delivered in batches, each after the puts of its methods are stored. What this
        executor's thread does after each method; tests call it to finish a method at a
        chosen moment. Raises RuntimeError when the loop is closed."""
        with self._lock:
            self._done.append((call, status, value))
            wake = not self._wake_scheduled
            self._wake_scheduled = True
        if wake:
            self.runtime.loop.call_soon_threadsafe(self._deliver)

    def running_here(self) -> bool:
        """True when called from this executor's thread (inside an actor method)."""
        return threading.get_ident() == self._thread.ident

    def flush_puts(self) -> None:
        """Store the values put by the running method so far (on the loop)."""
        while self.pending_puts:
            object_id, value = self.pending_puts.popleft()
            self.runtime.store.set(object_id, STATUS_OK, value)
        if self.after_flush_puts is not None:
            self.after_flush_puts()

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, deque()
            self._wake_scheduled = False
        # After taking the results: every put a taken method made is queued by now, so it
        # is stored before that method's reply (which may carry its ref) goes out.
        self.flush_puts()
        for call, status, value in done:
            self.runtime._finish(call, status, value)


def import_class(class_path: str) -> type:
    """Import ``"pkg.module:Class"`` (or ``pkg.module.Class``) from installed modules."""
    module_name, sep, attr = class_path.partition(":")
    if not sep:
        module_name, _, attr = class_path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"class path {class_path!r} must look like 'pkg.module:Class'")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
