"""The owner side: the objects this process owns, put here and served to the processes
that fetch them.

Objects are stored in an :class:`~actorrl.runtime.process.refs.ObjectStore`. A fetch that keeps
the object (a weights version many processes read) is answered with an encoding made
once per object; a same-host fetch gets the object's big arrays through shared-memory
segments placed once per object and handed back to the pool when it is freed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actorrl.runtime.process.hosting import Hosting, ThreadedHost, current_hosting
from actorrl.runtime.process.refs import (
    STATUS_OK,
    ObjectRef,
    ObjectStore,
    new_object_id,
    ready_order,
)
from transport import shm as shm_segments
from transport.codec import Codec, EncodeError
from transport.rpc import Request

if TYPE_CHECKING:
    from actorrl.runtime.process.runtime import Runtime

class OwnedObjects:
    """This process's objects: :meth:`put` stores one, :meth:`on_fetch`, :meth:`on_wait`
    and :meth:`on_free` serve the protocol requests of other processes."""

    def __init__(self, runtime: Runtime, shm_threshold: int,
                 shm_pool: shm_segments.SegmentPool | None) -> None:
        self.runtime = runtime
        self.loop: asyncio.AbstractEventLoop = runtime.loop
        self.codec: Codec = runtime.codec
        self.shm_threshold = shm_threshold
        self.shm_pool = shm_pool
        self.store = ObjectStore(self.loop, on_drop=self._drop_object)
        self.address = ""
        """This process's endpoint (set once the runtime's server is bound)."""
        self.host: ThreadedHost | None = None
        """The host of this process's actor, if any (its methods' puts wait for it)."""
        self._shm_objects: dict[bytes, dict] = {}
        """Segments placed for stored objects fetched by same-host processes, by id."""
        self._encoded_objects: dict[bytes, list[Any]] = {}
        """Fetch replies of stored objects fetched without freeing, encoded once, by id."""
        self._on_loop: Callable[[], bool] = runtime.on_loop

    # ---- put --------------------------------------------------------------------------------
    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` in this process and return a ref others can fetch (thread-safe).

        Called by actor code of a serial-mode actor, the object is owned by that actor
        (it is lost when the actor dies), as it would be in the actor's own process."""
        hosting = current_hosting()
        if hosting is not None and hosting.store is not self.store and \
                hosting.runtime is self.runtime:
            return self._put_in(hosting, value)
        ref = ObjectRef(new_object_id(), self.address)
        ref._runtime = self.runtime
        ref._tracked = True
        ref._value = (STATUS_OK, value)
        ref._has_value = True
        ref._ready_seq = next(ready_order)
        host = self.host
        if self._on_loop():
            self.store.set(ref.id, STATUS_OK, value)
        elif host is not None and host.executor.running_here():
            # Inside an actor method: stored when the method's result reaches the loop
            # (before the result is replied), which saves a loop wake-up per put.
            host.executor.pending_puts.append((ref.id, value))
        else:
            self.loop.call_soon_threadsafe(self.store.set, ref.id, STATUS_OK, value)
        return ref

    def _put_in(self, hosting: Hosting, value: Any) -> ObjectRef:
        ref = ObjectRef(new_object_id(), hosting.address)
        ref._runtime = self.runtime
        ref._tracked = True
        ref._ready_seq = next(ready_order)
        if self._on_loop():
            hosting.store.set(ref.id, STATUS_OK, value)
        else:
            self.loop.call_soon_threadsafe(hosting.store.set, ref.id, STATUS_OK, value)
        return ref

    # ---- serving ----------------------------------------------------------------------------
    def on_fetch(self, request: Request) -> None:
        """``__fetch__(object_id, free)``: reply ``[status, value]`` once it exists."""
        object_id, free = request.args
        store = self.store

        def send(status: int, value: Any) -> None:
            if (request.local and not free and status == STATUS_OK
                    and self.shm_pool is not None and store.lookup(object_id) is not None):
                # A same-host fetch: big arrays go as segments placed once per object
                # (unlinked when it is freed), never before it is freed.
                cache = self._shm_objects.setdefault(object_id, {})
                request.reply([status, value], shm_segments.StoredPlacer(
                    cache, self.shm_threshold, self.shm_pool))
                if not cache:
                    del self._shm_objects[object_id]
            elif not free and status == STATUS_OK and store.lookup(object_id) is not None:
                self._reply_stored(request, object_id, value)
            else:
                request.reply([status, value])
            if free:
                store.free(object_id)

        store.when_ready(object_id, send)

    def on_wait(self, request: Request) -> None:
        """``__wait__(object_id)``: reply ``status`` once it exists (no value)."""
        self.store.when_ready(request.args[0], lambda s, v: request.reply(s))

    def on_free(self, request: Request) -> None:
        """``__free__(object_ids)``: drop them."""
        for object_id in request.args[0]:
            self.store.free(object_id)

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

    def _drop_object(self, object_id: bytes) -> None:
        self._encoded_objects.pop(object_id, None)
        cache = self._shm_objects.pop(object_id, None)
        if cache:
            shm_segments.StoredPlacer.release(cache, self.shm_pool)

    def close(self) -> None:
        """Release the segments placed for stored objects (the pool is closed by now)."""
        for cache in self._shm_objects.values():
            shm_segments.StoredPlacer.release(cache)  # unlinked: the pool is closed
        self._shm_objects.clear()
