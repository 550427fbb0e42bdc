"""Actor hosting: running one actor's methods for its callers.

An :class:`ActorHost` takes the calls made to one actor, resolves their ref arguments,
starts them in each caller's submission order, runs them (coroutine methods as tasks on
the loop, synchronous ones as its subclass says) and stores and replies their results.
Process mode (:class:`ThreadedHost`, one per actor process) runs synchronous methods in one
executor thread; serial mode (:class:`actorrl.runtime.process.serial.SerialActor`) runs them
inline on the driver's loop. Both are this class: what one mode does to a call, the other
does too.

A host is built from the few things it uses: the actor's
:class:`~actorrl.runtime.process.scope.ActorScope` (entered around the actor's code, so
that ``Runtime.current()`` names the runtime hosting it), the loop, the store its results
go to, and a :class:`RefReader` for the values of ref arguments.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from actorrl.runtime.errors import GetTimeoutError
from actorrl.runtime.process.owned import PutBuffer
from actorrl.runtime.process.refs import ObjectRef
from actorrl.runtime.process.scope import ActorScope, enter_scope, scoped_context
from actorrl.runtime.process.store import STATUS_ERROR, STATUS_OK, ObjectStore
from actorrl.util.classpath import resolve
from transport.errors import RemoteError
from transport.timeouts import wait_for

INLINE_RESULT_BYTES = 16 * 1024
"""Results up to about this size travel inline with the call's reply (one round trip);
larger ones stay with the actor until fetched."""
REF_ARGS_TIMEOUT_S = 300.0
"""How long an actor call waits for the values of its ref arguments before it fails."""


class HoldsValues(Protocol):
    """A value that holds others which :func:`estimate_size` should count (a batch of
    per-policy batches): it lists them. Types of higher layers implement it without
    importing the runtime."""

    def held_values(self) -> Iterable[Any]:
        """The values this one holds."""
        ...


def estimate_size(value: Any, budget: int = 256) -> int:
    """A cheap upper-bound-ish estimate of a value's wire size, to decide inlining.

    Walks at most ``budget`` containers/items (what a :class:`HoldsValues` holds
    included); anything past the budget counts as large.
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
        else:
            # Looked up on the type: a handle answers any attribute name with a method.
            held = getattr(type(item), "held_values", None)
            if held is not None:
                stack.extend(held(item))
            else:
                total += 16
    return total


def import_class(class_path: str) -> Any:
    """The class ``"pkg.module:Class"`` (or ``pkg.module.Class``) names, found by
    :func:`actorrl.util.classpath.resolve`: ValueError naming what is wrong with a bad
    path (malformed, a module that cannot be imported, a missing attribute)."""
    if ":" not in class_path and "." in class_path:
        module_name, _, attr = class_path.rpartition(".")
        class_path = f"{module_name}:{attr}"
    return resolve(class_path, "actor class")


def public_method(instance: Any, name: str) -> Callable[..., Any] | RemoteError:
    """The public method ``name`` of a hosted actor, or the error a caller gets when it
    has none."""
    fn = getattr(instance, name, None) if not name.startswith("_") else None
    if fn is None or not callable(fn):
        return RemoteError("AttributeError",
                           f"{type(instance).__qualname__} has no public method {name!r}")
    return fn


# ---------------------------------------------------------------------- the host
class CallRequest(Protocol):
    """What a call arrives as: a served :class:`transport.rpc.Request`, or its stand-in
    for a call made inside this process (serial mode)."""

    args: list[Any]
    """``[object_id, method, args, kwargs]``."""
    peer: Any
    """The caller (calls of one caller start in its submission order)."""

    def reply(self, value: Any) -> None:
        """Answer the call with ``[status, inline, value]``."""
        ...


class HostedCall:
    """An actor call received by a host, waiting to run in its caller's submission
    order."""

    __slots__ = ("request", "object_id", "method", "args", "kwargs", "resolution")

    def __init__(self, request: CallRequest, object_id: bytes, method: str, args: list,
                 kwargs: dict) -> None:
        self.request = request
        self.object_id = object_id
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.resolution: asyncio.Future | None = None


class RefReader(Protocol):
    """How a host reads the values of its calls' ref arguments (the caller side of the
    runtime hosting it)."""

    def peek(self, ref: ObjectRef) -> tuple[int, Any] | None:
        """``ref``'s ``(status, value)`` when it is here now, else None."""
        ...

    async def get_one(self, ref: ObjectRef) -> Any:
        """``ref``'s value (raises its error)."""
        ...


class ActorHost:
    """Runs one actor's calls: method dispatch, per-caller order, ref-argument resolution,
    results stored under the call's object id in :attr:`store` and replied.

    Subclasses say how a synchronous method runs (:meth:`_run_sync`), and may change how
    an error is recorded (:meth:`_error`) and what is done to a result (:meth:`_finish`).
    """

    def __init__(self, instance: Any, scope: ActorScope, loop: asyncio.AbstractEventLoop,
                 store: ObjectStore, reader: RefReader) -> None:
        """``scope``: entered around the actor's code; ``store``: where results go;
        ``reader``: reads ref arguments."""
        self.instance = instance
        self.scope = scope
        self.store = store
        self.loop = loop
        self._get_one = reader.get_one
        self._peek = reader.peek
        self._calls: dict[Any, deque[HostedCall]] = {}
        """Calls not started yet, per caller."""
        self._pumping: set[Any] = set()
        self._tasks: set[asyncio.Task] = set()
        """Coroutine methods running."""

    def on_call(self, request: CallRequest) -> None:
        """Take the call ``request`` carries; it starts once the caller's earlier calls
        have and its ref arguments are resolved."""
        object_id, method, args, kwargs = request.args
        self.store.add_pending(object_id)
        call = HostedCall(request, object_id, method, args, kwargs)
        refs = [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef)]
        if refs and not self._resolve_now(call):
            call.resolution = self.loop.create_task(self._resolve_args(call))
        self._calls.setdefault(request.peer, deque()).append(call)
        self._pump(request.peer)

    def _resolve_now(self, call: HostedCall) -> bool:
        """Replace ``call``'s ref arguments by their values when every one is here now
        with a value (an error or a wait goes the way of :meth:`_resolve_args`)."""
        found: list[tuple[int | str, Any]] = []
        for key, arg in (*enumerate(call.args), *call.kwargs.items()):
            if isinstance(arg, ObjectRef):
                value = self._peek(arg)
                if value is None or value[0] != STATUS_OK:
                    return False
                found.append((key, value[1]))
        for key, value in found:
            if isinstance(key, int):
                call.args[key] = value
            else:
                call.kwargs[key] = value
        return True

    async def _resolve_args(self, call: HostedCall) -> None:
        """Replace ``call``'s ref arguments by their values, within
        :data:`REF_ARGS_TIMEOUT_S` (a missing object or a slow owner fails this call
        only, with an error that says so)."""
        get_one = self._get_one

        async def resolve(value: Any) -> Any:
            return await get_one(value) if isinstance(value, ObjectRef) else value

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

    def _pump(self, caller: Any) -> None:
        """Start ``caller``'s calls in its submission order. A call waiting for its ref
        arguments holds back that caller's later calls only: other callers go on. (A call
        made by a method running inline here waits for that method: it is pumping.)"""
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

    def _start(self, call: HostedCall) -> None:
        if call.resolution is not None and call.resolution.exception() is not None:
            self._finish(call, STATUS_ERROR, RemoteError.from_exception(
                call.resolution.exception()))
            return
        fn = public_method(self.instance, call.method)
        if isinstance(fn, RemoteError):
            self._finish(call, STATUS_ERROR, fn)
            return
        if inspect.iscoroutinefunction(fn):
            try:  # bad arguments raise here, before a coroutine exists
                coro = fn(*call.args, **call.kwargs)
            except Exception as exc:
                self._finish(call, STATUS_ERROR, self._error(call, exc))
                return
            task = self.loop.create_task(coro, context=scoped_context(self.scope))
            self._tasks.add(task)
            task.add_done_callback(lambda t, c=call: self._finish_task(c, t))
        else:
            self._run_sync(call, fn)

    def _run_sync(self, call: HostedCall, fn: Callable[..., Any]) -> None:
        """Run the synchronous method ``fn`` for ``call`` and :meth:`_finish` it."""
        raise NotImplementedError

    def _error(self, call: HostedCall, exc: BaseException) -> RemoteError:
        """The stored form of the error ``exc`` that ``call``'s method raised."""
        return RemoteError.from_exception(exc)

    def _finish_task(self, call: HostedCall, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            self._finish(call, STATUS_ERROR, RemoteError("CancelledError", "call cancelled"))
        elif task.exception() is not None:
            self._finish(call, STATUS_ERROR, self._error(call, task.exception()))
        else:
            self._finish(call, STATUS_OK, task.result())

    def _finish(self, call: HostedCall, status: int, value: Any) -> None:
        self.store.set(call.object_id, status, value)
        inline = status != STATUS_OK or estimate_size(value) <= INLINE_RESULT_BYTES
        call.request.reply([status, inline, value if inline else None])

    def stop(self) -> None:
        """Drop the calls not started yet and cancel the running coroutine methods."""
        calls, self._calls = self._calls, {}
        for waiting in calls.values():
            for call in waiting:
                if call.resolution is not None:
                    call.resolution.cancel()
        for task in list(self._tasks):
            task.cancel()


class ThreadedHost(ActorHost):
    """The host of an actor process: synchronous methods run one at a time, in order, in
    one executor thread (so the event loop never blocks); what they put waits in ``puts``
    until their results reach the loop."""

    def __init__(self, instance: Any, scope: ActorScope, loop: asyncio.AbstractEventLoop,
                 store: ObjectStore, reader: RefReader, puts: PutBuffer) -> None:
        super().__init__(instance, scope, loop, store, reader)
        self.executor = _ActorExecutor(self, puts)
        self._run_sync = self.executor.submit  # type: ignore[method-assign]

    def stop(self) -> None:
        """Stop the executor thread after the methods handed to it."""
        self.executor.stop()


class _ActorExecutor:
    """One thread that runs an actor's synchronous methods, one at a time, in order, so the
    event loop never blocks. Results are handed back to the loop in batches, each after
    the values its methods put (held in ``puts``) are stored."""

    def __init__(self, host: ActorHost, puts: PutBuffer) -> None:
        self.host = host
        self._loop = host.loop
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._incoming: list[tuple[HostedCall, Callable[..., Any]]] = []
        self._handover_scheduled = False
        self._done: deque[tuple[HostedCall, int, Any]] = deque()
        self._puts = puts
        self.pending_puts = puts.pending
        """What the running methods put, not stored yet (the put buffer's queue)."""
        self._lock = threading.Lock()
        self._wake_scheduled = False
        self.after_flush_puts: Callable[[], None] | None = None
        """Test hook: runs on the loop after each :meth:`flush_puts`, to force the race of
        a method finishing while an earlier result is being delivered."""
        self._thread = threading.Thread(target=self._run, name="actor-executor", daemon=True)
        self._thread.start()

    def submit(self, call: HostedCall, fn: Callable[..., Any]) -> None:
        """Run ``fn`` for ``call`` after the calls submitted before it (on the loop).

        The calls started in one loop iteration are handed to the thread together at its
        end: one wake-up of the thread per burst, made when the loop is about to let go of
        the GIL (a thread woken earlier would wake again to wait for it)."""
        self._incoming.append((call, fn))
        if not self._handover_scheduled:
            self._handover_scheduled = True
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._handover_scheduled = False
        if self._incoming:
            batch, self._incoming = self._incoming, []
            self._queue.put(batch)

    def stop(self) -> None:
        """End the thread after the methods handed to it."""
        self._hand_over()
        self._queue.put(None)

    def _run(self) -> None:
        enter_scope(self.host.scope)  # this thread runs only the actor's methods
        self._puts.hold_this_thread()
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

    def hand_back(self, call: HostedCall, status: int, value: Any) -> None:
        """Hand a finished call's result to the loop (from any thread): results are
        delivered in batches, each after the puts of its methods are stored. What this
        executor's thread does after each method; tests call it to finish a method at a
        chosen moment. Raises RuntimeError when the loop is closed."""
        with self._lock:
            self._done.append((call, status, value))
            wake = not self._wake_scheduled
            self._wake_scheduled = True
        if wake:
            self._loop.call_soon_threadsafe(self._deliver)

    def flush_puts(self) -> None:
        """Store the values put by the running method so far (on the loop)."""
        self._puts.flush()
        if self.after_flush_puts is not None:
            self.after_flush_puts()

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, deque()
            self._wake_scheduled = False
        # After taking the results: every put a taken method made is queued by now, so it
        # is stored before that method's reply (which may carry its ref) goes out.
        self.flush_puts()
        finish = self.host._finish
        for call, status, value in done:
            finish(call, status, value)
