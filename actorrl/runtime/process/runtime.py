"""The per-process runtime: binds the parts that make a process an actor-framework peer.

Every process (driver, coordinator, actor) has exactly one :class:`Runtime`, bound to its
event loop. It serves an RPC endpoint through which other processes fetch the objects it
owns and, in an actor process, call the actor's methods. Its parts, one job each, each
built from the few things it uses (the loop's thread, the codec, the store, the peers, a
function or two of another part), never from the runtime:

- :class:`~actorrl.runtime.process.peers.Peers`: connections, dead endpoints, the stores
  of the owners in this process and the actors hosted in it (serial mode), shared-memory
  routing;
- :class:`~actorrl.runtime.process.frees.FreeQueue`: frees sent to owners, batched;
- :class:`~actorrl.runtime.process.owned.OwnedObjects`: the owner side (put, fetches
  served, with :class:`~actorrl.runtime.process.owned.FetchReplies` made once per object
  and the actor's :class:`~actorrl.runtime.process.owned.PutBuffer`);
- :class:`~actorrl.runtime.process.calls.Calls`: the caller side (submit, get, wait);
- :class:`~actorrl.runtime.process.hosting.ThreadedHost`: the hosted actor, in an actor
  process.

They are made in that order, each from what the ones before it offer, so the order cannot
be got wrong. The runtime's operations are its parts' methods: ``runtime.submit`` is
``runtime.calls.submit``, bound on first use (see :class:`Forwarded`) and read like any
attribute after that, so no call goes through an extra layer.

There is no process-global runtime: whoever needs one is handed it (the driver's
``runtime``, a handle's runtime, a pipeline's constructor argument). Actor code, which is
built from a class path and cannot be handed anything, asks :meth:`Runtime.current`: the
runtime hosting the method that is running, read from the actor's
:class:`~actorrl.runtime.process.scope.ActorScope`, which the host enters for the duration
of each call (a context variable, so it is right in serial mode too, where many actors
share a loop).

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
(:meth:`Peers.mark_dead <actorrl.runtime.process.peers.Peers.mark_dead>`) and when runtimes
start and close. ``ACTORRL_SHM=0`` (or ``Runtime(shm=False)``) turns it off,
``ACTORRL_SHM_THRESHOLD`` (or ``shm_threshold``) sets the size; across hosts arrays travel
as ZeroMQ frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actorrl.runtime.errors import RuntimeNotStartedError
from actorrl.runtime.network import Network
from actorrl.runtime.process.calls import Calls
from actorrl.runtime.process.frees import FreeQueue
from actorrl.runtime.process.handles import BindingCodec
from actorrl.runtime.process.hosting import ThreadedHost, _ActorExecutor
from actorrl.runtime.process.loop import LoopThread
from actorrl.runtime.process.owned import FetchReplies, OwnedObjects, PutBuffer
from actorrl.runtime.process.peers import Peers, ipc_address
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.scope import ActorScope, current_scope
from actorrl.runtime.process.store import ObjectStore
from actorrl.util.forward import Forwarded, PartAttribute
from transport import shm as shm_segments
from transport.auth import check_bind, ensure_authenticator
from transport.codec import set_type_resolver
from transport.endpoint import Endpoint
from transport.rpc import Request, RpcServer

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

    submit = Forwarded("calls", Calls.submit)
    get_async = Forwarded("calls", Calls.get_async)
    get_and_free_async = Forwarded("calls", Calls.get_and_free_async)
    wait_async = Forwarded("calls", Calls.wait_async)
    on_ready = Forwarded("calls", Calls.on_ready)
    call_error = Forwarded("calls", Calls.call_error)
    free = Forwarded("frees", FreeQueue.free)
    client = Forwarded("peers", Peers.client)
    connect = Forwarded("peers", Peers.connect)
    connection_lost = Forwarded("peers", Peers.connection_lost)
    mark_dead = Forwarded("peers", Peers.mark_dead)
    forget_dead = Forwarded("peers", Peers.forget_dead)
    shm_to = Forwarded("peers", Peers.shm_to)
    on_loop = Forwarded("loop_thread", LoopThread.on_loop)
    before_loop_request = Forwarded("puts", PutBuffer.flush_soon)

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
        self.loop_thread = LoopThread(loop)
        self.name = name
        self.network = network
        self.codec = BindingCodec(self)
        """Encodes and decodes every message; the actor handles it decodes submit their
        calls through this runtime."""
        shm_pool = _segment_pool(shm)
        if shm_threshold is None:
            shm_threshold = int(os.environ.get("ACTORRL_SHM_THRESHOLD",
                                               shm_segments.DEFAULT_THRESHOLD))
        self.server = RpcServer(self._on_request, codec=self.codec, **(server_options or {}))
        self.local_address, self.address = bind_server(
            self.server, address_dir, name, extra_bind, network)
        """``local_address``: this process's ipc endpoint; ``address``: the endpoint
        other processes use (refs and handles carry it; tcp with a network)."""
        replies = FetchReplies(self.codec, shm_threshold, shm_pool)
        store = ObjectStore(loop, on_drop=replies.drop)
        self.puts = PutBuffer(self.loop_thread, store)
        self.peers = Peers(loop, self.codec, network, self.address, store, shm_pool)
        self.frees = FreeQueue(self.loop_thread, self.peers, self.puts.flush_soon)
        self.objects = OwnedObjects(self.loop_thread, store, replies, self.puts, self.address,
                                    self.frees.release)
        self.calls = Calls(self.loop_thread, self.codec, self.peers, self.frees,
                           self.puts.flush_soon, shm_threshold)
        self.host: ThreadedHost | None = None
        """The host of this process's actor (None before :meth:`host_actor`)."""
        self.exit_event = asyncio.Event()
        self.closed = False
        self._handlers: dict[str, Callable[[Request], None]] = {
            "__call__": self._no_actor,
            "__fetch__": self.objects.on_fetch,
            "__wait__": self.objects.on_wait,
            "__free__": self.objects.on_free,
            "__ping__": lambda request: request.reply(self.name),
            "__exit__": lambda request: self.exit_event.set(),
        }

    store = PartAttribute[ObjectStore]("objects")
    """The objects this process owns."""

    shm = PartAttribute[bool]("peers")
    """Whether bulk arrays to same-host processes go through shared memory."""

    shm_pool = PartAttribute[shm_segments.SegmentPool | None]("peers")
    """Segments call arguments are copied into (reused); None without shm."""

    shm_threshold = PartAttribute[int]("calls")
    """The smallest array, in bytes, that goes through shared memory."""

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
    def actor(self) -> Any:
        """The actor this process hosts, if any."""
        return self.host.instance if self.host is not None else None

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

    # ------------------------------------------------------------------ objects
    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` here and return a ref others can fetch (thread-safe). Called by
        the code of an actor this runtime hosts, the object is owned by that actor (see
        :class:`~actorrl.runtime.process.scope.ActorScope`): in serial mode by the actor,
        not the driver; in an actor process, a synchronous method's puts are stored with
        its result (:meth:`OwnedObjects.put
        <actorrl.runtime.process.owned.OwnedObjects.put>`)."""
        scope = current_scope()
        if scope is not None and scope.runtime is self:
            return scope.put(value)
        return self.objects.put(value)

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

        Not a process-global: it is read from the actor's scope, which the host enters for
        the duration of each call (and which follows the call into
        ``asyncio.to_thread``); anywhere else it raises. Code outside actors is handed its
        runtime (``driver.runtime``, ``handle.runtime``)."""
        scope = current_scope()
        runtime = scope.runtime if scope is not None else None
        if not isinstance(runtime, Runtime) or runtime.closed:
            raise RuntimeNotStartedError(
                "Runtime.current() is for actor code (it names the runtime hosting the "
                "running actor method); elsewhere use the runtime you were given "
                "(driver.runtime, handle.runtime)")
        return runtime

    def actor_scope(self) -> ActorScope:
        """This runtime as the scope of the actor code it runs in its own process (what
        that code puts is owned by this process)."""
        return ActorScope(self, self.objects.put)

    def close(self) -> None:
        """Close every socket; pending calls fail."""
        if self.closed:
            return
        self.frees.flush()
        self.closed = True
        self.calls.close()
        self.frees.close()
        if self.host is not None:
            self.host.stop()
        self.peers.close()
        self.server.close()
        if self.shm_pool is not None:
            self.shm_pool.close()
            self.objects.close()
            shm_segments.sweep_dead_owner_segments()

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
        self.host = ThreadedHost(instance, self.actor_scope(), self.loop, self.store,
                                 self.calls, self.puts)
        self._handlers["__call__"] = self.host.on_call

    def _no_actor(self, request: Request) -> None:
        raise ValueError(f"{self.name} hosts no actor; cannot call {request.args[1]!r}")


def _segment_pool(shm: bool | None) -> shm_segments.SegmentPool | None:
    """The pool of segments call arguments are copied into: None with shm off (``shm``
    False, or None and ``ACTORRL_SHM=0``) or unavailable here."""
    if shm is None:
        shm = shm_segments.enabled_by_env()
    if shm and not shm_segments.available():
        shm_segments.warn_fallback(OSError(f"{shm_segments.SHM_DIR} is not writable"))
        shm = False
    return shm_segments.SegmentPool() if shm else None


def bind_server(server: RpcServer, address_dir: str, name: str, extra_bind: Sequence[str],
                network: Network | None) -> tuple[str, str]:
    """Bind ``server``: ipc in ``address_dir``, tcp with a network, ``extra_bind``.
    Returns ``(local_address, address)``: the ipc endpoint, and the one other processes
    use (an endpoint carrying the tcp address, key and node tag with a network)."""
    local_address = server.bind(ipc_address(address_dir, name))
    address = local_address
    security = network.security if network is not None else None
    if security is not None:
        ensure_authenticator(security.allowed, security.roles)
    if network is not None and network.host is not None:
        tcp = server.bind(network.tcp_bind_address(),
                          security.identity.secret if security else None)
        address = str(Endpoint(
            tcp, security.identity.public if security else None, network.node_tag,
            local_address if network.node_tag else None))
    for extra in extra_bind:
        check_bind(extra, security, network is not None and network.insecure_loopback)
        server.bind(extra, security.identity.secret if security else None)
    return local_address, address
