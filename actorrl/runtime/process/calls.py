"""The caller side: submitting calls to actors and resolving refs (get, wait).

:class:`Calls` encodes a call in the caller's thread, sends it on the loop (to a
connection, or to a serial actor of this process) and resolves its ref from the reply:
small results come inline with it, large ones are fetched from their owner once, however
many gets wait on the ref.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from actorrl.runtime.errors import ActorDiedError, GetTimeoutError, ObjectLostError
from actorrl.runtime.process.frees import FreeQueue
from actorrl.runtime.process.handles import ActorHandle
from actorrl.runtime.process.loop import LoopThread
from actorrl.runtime.process.peers import Peers
from actorrl.runtime.process.refs import ObjectRef, completion_order, new_object_id
from actorrl.runtime.process.store import STATUS_ERROR, STATUS_OK
from transport import shm as shm_segments
from transport.codec import Codec
from transport.errors import PeerLostError, RemoteError, TransportError
from transport.timeouts import wait_for


def raise_for(status: int, value: Any, ref: ObjectRef) -> Any:
    """``value`` when ``status`` is OK, else raise the error it records."""
    if status == STATUS_OK:
        return value
    if status == STATUS_ERROR:
        if isinstance(value, RemoteError):
            raise value.typed()  # `except ValueError` / `except ActorDiedError` match it
        if isinstance(value, BaseException):
            raise value
        raise RemoteError("Error", str(value))
    raise ObjectLostError(f"{ref!r} does not exist at its owner (freed, or never created)")


class Calls:
    """This process's calls to actors and its gets and waits on refs (loop thread, except
    :meth:`submit`).

    Built from the loop's thread, the codec calls are encoded with, the peers they go to,
    the free queue (frees ride along with calls; refs free their objects through it),
    ``before_loop_request`` (called off the loop before a call is handed to it) and the
    size from which call arguments' arrays go through shared memory. It holds the peer
    tables and the free queue's operations directly (they are never replaced): a call
    costs no more lookups than when all this was one class."""

    def __init__(self, loop: LoopThread, codec: Codec, peers: Peers, frees: FreeQueue,
                 before_loop_request: Callable[[], None], shm_threshold: int) -> None:
        self.loop = loop.loop
        self._on_loop = loop.on_loop
        self.codec = codec
        self.shm_pool = peers.shm_pool
        self.shm_threshold = shm_threshold
        self.shm_calls = peers.shm
        """Whether call arguments use shared memory (set False to send them as ZeroMQ
        frames, e.g. to compare; fetch replies are unaffected)."""
        self.closed = False
        self.peers = peers
        self._dead = peers.dead
        self._in_process = peers.in_process
        self._stores = peers.stores
        self._client = peers.client
        self._shm_to = peers.shm_to
        self._frees = frees.queue
        self._flush_frees = frees.flush
        self._frees_ride_with = frees.ride_with
        self._free = frees.free
        self._release = frees.release
        self._before_loop_request = before_loop_request

    def close(self) -> None:
        """Fail the calls sent from now on (the runtime is closing)."""
        self.closed = True

    # ---- calls ------------------------------------------------------------------------------
    def submit(self, handle: ActorHandle, method: str, args: Sequence[Any],
               kwargs: dict[str, Any]) -> ObjectRef:
        """Submit ``handle.method(*args, **kwargs)``; returns the result's ref at once.

        Encoding happens here, in the caller's thread, so unsupported argument types fail
        immediately; sending happens on the loop.
        """
        object_id = new_object_id()
        ref = ObjectRef(object_id, handle.endpoint, self._release)
        pinned = [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef)]
        escaped = [a.escaped for a in pinned]
        body = ["__call__", [object_id, method, list(args), kwargs], {}]
        placer = None
        if self.shm_calls and self.shm_pool is not None and self._shm_to(handle.endpoint):
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
            arg.sent_as_argument(was_escaped)  # kept alive by the call's future
        # Made here, in the caller's thread too: the ref has its call's future from the
        # start (the send may come a loop iteration later).
        fut = _CallFuture(self.peers, ref, handle, pinned or None)
        ref.attach_call(fut)
        if self._on_loop():
            # The frame that made the call: an actor of this process (serial mode) may run
            # it inline, under that frame, right now.
            self._send_call(fut, handle, frames, placer,
                            sys._getframe(1) if self._in_process else None)
        else:
            self._before_loop_request()
            self.loop.call_soon_threadsafe(self._send_call, fut, handle, frames, placer, None)
        return ref

    def _send_call(self, fut: _CallFuture, handle: ActorHandle, frames: list[Any],
                   placer: shm_segments.CallPlacer | None, caller: FrameType | None) -> None:
        if handle.endpoint in self._dead:
            fut.set_exception(self.peers.died_error(handle.endpoint, repr(handle)))
        elif self.closed:
            fut.set_exception(ActorDiedError("the runtime is shut down"))
        else:
            actor = self._in_process.get(handle.endpoint)
            if actor is not None:  # serial mode: the actor lives here; the call may run now
                actor.accept(frames, fut, caller)
                return
            if self._frees:
                self._frees_ride_with(handle.endpoint)
            try:  # the reply (or the connection's loss) resolves fut itself
                self._client(handle.endpoint).call_encoded(frames, placer=placer, future=fut)
            except Exception as exc:  # a full send queue, a bad endpoint: the call failed
                fut.set_exception(exc)
            else:
                if placer is not None:
                    self.peers.trim_later()
                placer = None  # released by the reply
        if placer is not None:
            placer.finish(False)

    def call_error(self, ref: ObjectRef) -> BaseException | None:
        """For a finished call this process submitted: the error that ended it without a
        result (e.g. ActorDiedError), else None. Never fetches the value."""
        fut = ref.call
        if fut is None or not fut.done():
            return None
        return None if fut.cancelled() else fut.exception()

    # ---- get --------------------------------------------------------------------------------
    async def get_async(self, ref: ObjectRef | Sequence[ObjectRef],
                        timeout_s: float | None = None) -> Any:
        """Resolve one ref or a list of refs (raises the remote error, ActorDiedError, or
        GetTimeoutError)."""
        if isinstance(ref, ObjectRef):
            coro = self.get_one(ref)
        else:
            coro = asyncio.gather(*(self.get_one(r) for r in ref))
        if timeout_s is None:
            return await coro
        try:
            return await wait_for(coro, timeout_s)
        except TimeoutError as exc:
            if isinstance(exc, RemoteError):  # the method itself timed out: not this get
                raise
            raise GetTimeoutError(f"get timed out after {timeout_s:g} s") from None

    async def get_and_free_async(self, refs: ObjectRef | Sequence[ObjectRef],
                                 timeout_s: float | None = None) -> Any:
        """Get, then free at the owner (like RLlib's ``ray_get_and_free``); the frees go
        with the next request to each owner, or within
        :data:`~actorrl.runtime.process.frees.FREE_DELAY_S`."""
        try:
            return await self.get_async(refs, timeout_s)
        finally:
            self._free(refs, soon=False)

    def peek(self, ref: ObjectRef) -> tuple[int, Any] | None:
        """``ref``'s ``(status, value)`` when it is here now (owned in this process, or
        its value came with its call's reply or a fetch), else None."""
        store = self._stores.get(ref.owner)
        if store is not None:
            return store.lookup(ref.id)
        return ref.found()

    async def get_one(self, ref: ObjectRef) -> Any:
        """Resolve one ref."""
        store = self._stores.get(ref.owner)
        if store is not None:
            found = store.lookup(ref.id)
            if found is None:
                fut = self.loop.create_future()
                store.when_ready(ref.id, lambda s, v: fut.done() or fut.set_result((s, v)))
                found = await fut
            return raise_for(found[0], found[1], ref)
        found = ref.found()
        if found is not None:
            return raise_for(found[0], found[1], ref)
        call = ref.call
        if call is not None:
            # A caller's timeout or cancel must not cancel the call itself, which later
            # gets of this ref still need. Raises ActorDiedError / transport errors.
            if not call.done():
                await call.wait_done()  # type: ignore[attr-defined]
            call.result()
            found = ref.found()
            if found is not None:
                return raise_for(found[0], found[1], ref)
        # One fetch per ref however many gets wait on it, shielded so a get that times out
        # leaves it running for the others (and the owner sends the value once).
        status, value = await asyncio.shield(ref.fetch(self._start_fetch))
        return raise_for(status, value, ref)

    def _start_fetch(self, ref: ObjectRef) -> asyncio.Task:
        return self.loop.create_task(self._fetch(ref))

    async def _fetch(self, ref: ObjectRef) -> tuple[int, Any]:
        if ref.owner in self._dead:
            raise ObjectLostError(str(self.peers.died_error(ref.owner, f"owner of {ref!r}")))
        if self._frees:  # always: this process's later reads see its earlier frees
            self._flush_frees(ref.owner)
        try:
            status, value = await self._client(ref.owner).call("__fetch__", [ref.id, False])
        except (PeerLostError, TransportError) as exc:
            raise ObjectLostError(
                str(self.peers.died_error(ref.owner, f"owner of {ref!r}", exc))) from None
        ref.fetched(status, value)
        return status, value

    # ---- wait -------------------------------------------------------------------------------
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

        store = self._stores.get(ref.owner)
        call = ref.call
        if store is not None and call is None:  # owned here, not a call of ours
            store.when_ready(ref.id, done)
            return fut, lambda: store.remove_waiter(ref.id, done)
        if ref.found() is not None:
            done()
            return fut, lambda: None
        if call is not None:
            return fut, watch(call)
        # A ref this process did not submit: one shared readiness task per ref, however
        # often it is waited on.
        return fut, watch(ref.readiness(self._start_remote_ready))

    def _start_remote_ready(self, ref: ObjectRef) -> asyncio.Task:
        return self.loop.create_task(self._remote_ready(ref))

    async def _remote_ready(self, ref: ObjectRef) -> None:
        if ref.owner in self._dead:
            return  # ready: a get raises ObjectLostError at once
        if self._frees:
            self._flush_frees(ref.owner)
        with contextlib.suppress(Exception):  # an error also means "ready" (get raises it)
            await self._client(ref.owner).call("__wait__", [ref.id])

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
        ready = sorted(order, key=completion_order)
        ready = ready[: max(num_returns, 0)] if len(ready) > num_returns else ready
        ready_ids = {r.id for r in ready}
        return ready, [r for r in refs if r.id not in ready_ids]


class _CallFuture(asyncio.Future):
    """The future of a call this process sent, resolved by its reply directly (no relay
    future in between, so a get resumes one loop iteration after the reply is read).

    A transport error (the actor's connection lost, a deadline) is set as the
    ActorDiedError a caller sees, with the transport error as its ``__cause__``; the ref
    gets an inline value the moment the reply sets it; and gets wait on waiters of their
    own (:meth:`wait_done`), so one that gives up never cancels the call. The refs passed
    directly as the call's arguments (``pinned``) are kept alive until it ends.

    Made where the call is submitted, in any thread (nothing here touches the loop until
    the call is sent on it)."""

    def __init__(self, peers: Peers, ref: ObjectRef, handle: ActorHandle,
                 pinned: list[ObjectRef] | None) -> None:
        super().__init__(loop=peers.loop)
        self._peers: Peers | None = peers
        self._ref: ObjectRef | None = ref  # a cycle with ref.call until the call ends
        self._handle = handle
        self._arguments = pinned
        self._waiters: list[asyncio.Future] | None = None

    def set_result(self, result: Any) -> None:
        """Resolve with the reply ``[status, inline, value]``."""
        super().set_result(result)
        inline = type(result) is list and len(result) == 3 and result[1]
        self._settle((result[0], result[2]) if inline else None)

    def set_exception(self, exception: Any) -> None:
        """Fail the call; a transport error becomes an ActorDiedError."""
        peers = self._peers
        if isinstance(exception, TransportError) and peers is not None:
            died = peers.died_error(self._handle.endpoint, repr(self._handle), exception)
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

    def _settle(self, found: tuple[int, Any] | None = None) -> None:
        ref, self._ref, self._peers, self._arguments = self._ref, None, None, None
        if ref is not None:
            ref.became_ready(found)
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
