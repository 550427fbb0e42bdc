"""The per-process runtime: binds the parts that make a process an actor-framework peer.

Every process (driver, coordinator, actor) has exactly one :class:`Runtime`, bound to its
event loop. It serves an RPC endpoint through which other processes fetch the objects it
owns and, in an actor process, call the actor's methods. Its parts, one job each:

- :class:`~actorrl.runtime.process.peers.Peers`: connections, dead endpoints, actors hosted in
  this process (serial mode), shared-memory routing;
- :class:`~actorrl.runtime.process.calls.Calls`: the caller side (submit, get, wait);
- :class:`~actorrl.runtime.process.owned.OwnedObjects`: the owner side (put, fetches served);
- :class:`~actorrl.runtime.process.frees.FreeQueue`: frees sent to owners, batched;
- :class:`~actorrl.runtime.process.hosting.ThreadedHost`: the hosted actor, in an actor process.

The runtime's operations are its parts' methods, bound at construction (``runtime.submit``
is ``runtime.calls.submit``): no call goes through an extra layer.

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
(:meth:`Peers.mark_dead <actorrl.runtime.process.peers.Peers.mark_dead>`) and when runtimes start
and close. ``ACTORRL_SHM=0`` (or ``Runtime(shm=False)``) turns it off,
``ACTORRL_SHM_THRESHOLD`` (or ``shm_threshold``) sets the size; across hosts arrays travel
as ZeroMQ frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actorrl.runtime.errors import RuntimeNotStartedError
from actorrl.runtime.network import Network
from actorrl.runtime.process.calls import Calls
from actorrl.runtime.process.frees import FreeQueue
from actorrl.runtime.process.handles import ActorHandle, _decoding_for
from actorrl.runtime.process.hosting import Hosting, ThreadedHost, _ActorExecutor, current_hosting
from actorrl.runtime.process.owned import OwnedObjects
from actorrl.runtime.process.peers import LocalHost, Peers, ipc_address
from actorrl.runtime.process.refs import ObjectRef, ObjectStore
from transport import shm as shm_segments
from transport.auth import check_bind, ensure_authenticator
from transport.codec import Codec, set_type_resolver
from transport.endpoint import Endpoint
from transport.rpc import Request, RpcClient, RpcServer

WIRE_TYPE_PACKAGES = ("actorrl.",)
"""Packages whose modules a decode may import to learn a wire type it has not seen."""


def import_wire_type_module(tag: str) -> None:
    """Import the module a wire type's tag names (``package.module.Class``) when it is one
    of actorrl's own: a process can decode typed values before it has imported what
    registers them (an actor's constructor arguments arrive before its class is imported;
    a coordinator or node agent relays actor specs holding typed configs)."""
    if tag.startswith(WIRE_TYPE_PACKAGES):
        with contextlib.suppress(ImportError):
            importlib.import_module(tag.rsplit(".", 1)[0])


set_type_resolver(import_wire_type_module)


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

    # Operations of the parts, bound in __init__ (see the module docstring).
    submit: Callable[[ActorHandle, str, Sequence[Any], dict[str, Any]], ObjectRef]
    """:meth:`Calls.submit <actorrl.runtime.process.calls.Calls.submit>`."""
    get_async: Callable[..., Any]
    """:meth:`Calls.get_async <actorrl.runtime.process.calls.Calls.get_async>`."""
    get_and_free_async: Callable[..., Any]
    """:meth:`Calls.get_and_free_async <actorrl.runtime.process.calls.Calls.get_and_free_async>`."""
    wait_async: Callable[..., Any]
    """:meth:`Calls.wait_async <actorrl.runtime.process.calls.Calls.wait_async>`."""
    on_ready: Callable[[ObjectRef, Callable[[], None]], None]
    """:meth:`Calls.on_ready <actorrl.runtime.process.calls.Calls.on_ready>`."""
    call_error: Callable[[ObjectRef], BaseException | None]
    """:meth:`Calls.call_error <actorrl.runtime.process.calls.Calls.call_error>`."""
    put: Callable[[Any], ObjectRef]
    """:meth:`OwnedObjects.put <actorrl.runtime.process.owned.OwnedObjects.put>`."""
    free: Callable[..., None]
    """:meth:`FreeQueue.free <actorrl.runtime.process.frees.FreeQueue.free>`."""
    release: Callable[..., None]
    """:meth:`FreeQueue.release <actorrl.runtime.process.frees.FreeQueue.release>`."""
    client: Callable[[str], RpcClient]
    """:meth:`Peers.client <actorrl.runtime.process.peers.Peers.client>` (loop thread only)."""
    connect: Callable[..., RpcClient]
    """:meth:`Peers.connect <actorrl.runtime.process.peers.Peers.connect>`."""
    connection_lost: Callable[[str], bool]
    """:meth:`Peers.connection_lost <actorrl.runtime.process.peers.Peers.connection_lost>`."""
    mark_dead: Callable[[str, str], None]
    """:meth:`Peers.mark_dead <actorrl.runtime.process.peers.Peers.mark_dead>`."""
    forget_dead: Callable[[str], None]
    """:meth:`Peers.forget_dead <actorrl.runtime.process.peers.Peers.forget_dead>`."""
    shm_to: Callable[[str], bool]
    """:meth:`Peers.shm_to <actorrl.runtime.process.peers.Peers.shm_to>`."""
    add_local_host: Callable[[str, LocalHost], None]
    """:meth:`Peers.add_local_host <actorrl.runtime.process.peers.Peers.add_local_host>`."""
    remove_local_host: Callable[[str, str], None]
    """:meth:`Peers.remove_local_host <actorrl.runtime.process.peers.Peers.remove_local_host>`."""

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
        self.network = network
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
        self.shm_pool = shm_segments.SegmentPool() if shm else None
        """Segments call arguments are copied into (reused)."""
        self.host: ThreadedHost | None = None
        """The host of this process's actor (None before :meth:`host_actor`)."""
        self.actor: Any = None
        """The actor this process hosts, if any."""
        self.exit_event = asyncio.Event()
        self.on_actor_died: list[Callable[[str, str], None]] = []
        self.closed = False

        self.objects = OwnedObjects(self, shm_threshold, self.shm_pool)
        self.store: ObjectStore = self.objects.store
        self.server = RpcServer(self._on_request, codec=self.codec, **(server_options or {}))
        self._bind(address_dir, name, extra_bind, network)
        self.objects.address = self.address
        self.peers = Peers(loop, self.codec, network, self.address, self.store, self.shm_pool)
        self.frees = FreeQueue(loop, self.peers, self.on_loop, self.before_loop_request)
        self.calls = Calls(self, self.peers, shm_threshold)
        self._handlers: dict[str, Callable[[Request], None]] = {
            "__call__": self._no_actor,
            "__fetch__": self.objects.on_fetch,
            "__wait__": self.objects.on_wait,
            "__free__": self.objects.on_free,
            "__ping__": lambda request: request.reply(self.name),
            "__exit__": lambda request: self.exit_event.set(),
        }
        self._bind_operations()

    def _bind(self, address_dir: str, name: str, extra_bind: Sequence[str],
              network: Network | None) -> None:
        """Bind the server: ipc in ``address_dir``, tcp with a network, ``extra_bind``."""
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

    def _bind_operations(self) -> None:
        calls, objects, frees, peers = self.calls, self.objects, self.frees, self.peers
        self.submit = calls.submit
        self.get_async = calls.get_async
        self.get_and_free_async = calls.get_and_free_async
        self.wait_async = calls.wait_async
        self.on_ready = calls.on_ready
        self.call_error = calls.call_error
        self.put = objects.put
        self.free = frees.free
        self.release = frees.release
        self.client = peers.client
        self.connect = peers.connect
        self.connection_lost = peers.connection_lost
        self.mark_dead = peers.mark_dead
        self.forget_dead = peers.forget_dead
        self.shm_to = peers.shm_to
        self.add_local_host = peers.add_local_host
        self.remove_local_host = peers.remove_local_host

    @property
    def shm_calls(self) -> bool:
        """Whether call arguments use shared memory (set False to send them as ZeroMQ
        frames, e.g. to compare; fetch replies are unaffected)."""
        return self.calls.shm_calls

    @shm_calls.setter
    def shm_calls(self, value: bool) -> None:
        self.calls.shm_calls = value

    @property
    def bytes_received(self) -> int:
        """Bytes this process received: requests at its server and replies on every
        cached connection (arrays read through shared memory included)."""
        return self.server.bytes_received + self.peers.traffic()["bytes_received"]

    @property
    def pending_frees(self) -> int:
        """Frees of collected refs queued here, not sent to their owners yet."""
        return len(self.frees.queue)

    @property
    def executor(self) -> _ActorExecutor | None:
        """The thread running the hosted actor's synchronous methods (None before
        :meth:`host_actor`)."""
        return self.host.executor if self.host is not None else None

    def traffic(self) -> dict[str, int]:
        """Bytes this runtime's server and its open client connections have sent and
        received (shared-memory payloads included; connections closed since are not)."""
        clients = self.peers.traffic()
        return {"bytes_sent": self.server.bytes_sent + clients["bytes_sent"],
                "bytes_received": self.server.bytes_received + clients["bytes_received"]}

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
        hosting = current_hosting()
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
        self.frees.flush()
        self.closed = self.calls.closed = self.frees.closed = True
        if self.host is not None:
            self.host.stop()
        self.peers.close()
        self.server.close()
        if self.shm_pool is not None:
            self.shm_pool.close()
            self.objects.close()
            shm_segments.sweep_dead_owner_segments()

    def on_loop(self) -> bool:
        """True when called from this runtime's event-loop thread."""
        return threading.get_ident() == self.loop_thread_id

    def before_loop_request(self) -> None:
        """Called off the loop before anything that may make another process fetch this
        one's objects (a call, a get, a free): objects an actor method put are stored first
        (the loop runs callbacks in order)."""
        host = self.host
        if host is not None and host.executor.pending_puts:
            self.loop.call_soon_threadsafe(host.executor.flush_puts)

    # ------------------------------------------------------------------ serving
    def _on_request(self, request: Request) -> None:
        method = request.method
        if method in _REQUEST_SHAPES:
            # Checked before any state changes: a malformed request gets an error reply
            # (it used to raise later, in a loop callback, leaving its object pending).
            check_request(method, request.args)
        handler = self._handlers.get(method)
        if handler is None:
            raise ValueError(f"unknown runtime method {method!r}")
        handler(request)

    def serve(self, method: str, handler: Callable[[Request], None]) -> None:
        """Serve an extra protocol method (used by nodes and the coordinator)."""
        if method in _REQUEST_SHAPES or method in ("__ping__", "__exit__"):
            raise ValueError(f"{method!r} is a method of the runtime's own protocol")
        self._handlers[method] = handler

    def host_actor(self, instance: Any) -> None:
        """Make this process serve ``instance``'s public methods (its synchronous ones in
        an executor thread, its coroutines as tasks on the loop; both see this runtime as
        :meth:`current`)."""
        self.actor = instance
        self.host = self.objects.host = ThreadedHost(instance, self.hosting())
        self._handlers["__call__"] = self.host.on_call

    def _no_actor(self, request: Request) -> None:
        raise ValueError(f"{self.name} hosts no actor; cannot call {request.args[1]!r}")
