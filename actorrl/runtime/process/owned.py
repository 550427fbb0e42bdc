"""The owner side: the objects this process owns, put here and served to the processes
that fetch them.

Objects are stored in an :class:`~actorrl.runtime.process.store.ObjectStore`.
:class:`FetchReplies` answers a fetch that keeps the object (a weights version many
processes read) with an encoding made once per object, and a same-host fetch with the
object's big arrays in shared-memory segments placed once per object, handed back to the
pool when it is freed. :class:`PutBuffer` holds what an actor process's synchronous methods
put until the loop stores it, and :class:`OwnedObjects` puts and serves the protocol.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from actorrl.runtime.process.loop import LoopThread
from actorrl.runtime.process.refs import ObjectRef, Release, new_object_id
from actorrl.runtime.process.store import STATUS_OK, ObjectStore
from transport import shm as shm_segments
from transport.codec import Codec, EncodeError
from transport.rpc import Request


class PutBuffer:
    """Values put in the executor thread of this process's actor (its synchronous
    methods), waiting for the loop to store them.

    They are stored in one batch when a method's result reaches the loop (before that
    result, which may carry their refs, is replied), or before this process sends a
    request that may make another process fetch one (:meth:`flush_soon`): a put costs no
    loop wake-up of its own. Empty, and holding no thread, in a process that hosts no
    actor."""

    def __init__(self, loop: LoopThread, store: ObjectStore) -> None:
        self.loop = loop.loop
        self.store = store
        self.pending: deque[tuple[bytes, Any]] = deque()
        """``(object_id, value)`` put and not stored yet."""
        self._thread_id: int | None = None

    def hold_this_thread(self) -> None:
        """From now on, the puts made in the calling thread (the actor's executor) wait
        here."""
        self._thread_id = threading.get_ident()

    def holds_this_thread(self) -> bool:
        """Whether a put made in the calling thread waits here."""
        return threading.get_ident() == self._thread_id

    def flush(self) -> None:
        """Store the values put so far (on the loop)."""
        pending, store = self.pending, self.store
        while pending:
            object_id, value = pending.popleft()
            store.set(object_id, STATUS_OK, value)

    def flush_soon(self) -> None:
        """Off the loop, before anything that may make another process fetch this one's
        objects (a call, a get, a free): the values put so far are stored first (the
        loop runs its callbacks in order)."""
        if self.pending:
            self.loop.call_soon_threadsafe(self.flush)


class FetchReplies:
    """The replies to fetches that keep a stored object, made once per object and dropped
    when it is freed (:meth:`drop`, the store's ``on_drop``)."""

    def __init__(self, codec: Codec, shm_threshold: int,
                 shm_pool: shm_segments.SegmentPool | None) -> None:
        self.codec = codec
        self.shm_threshold = shm_threshold
        self.shm_pool = shm_pool
        self._segments: dict[bytes, dict] = {}
        """Segments placed for stored objects fetched by same-host processes, by id."""
        self._encoded: dict[bytes, list[Any]] = {}
        """Fetch replies of stored objects fetched without freeing, encoded once, by id."""

    def send(self, request: Request, object_id: bytes, value: Any) -> None:
        """Reply ``[STATUS_OK, value]`` to a fetch of the stored object ``object_id`` that
        keeps it: a same-host fetch gets its big arrays as segments placed once per
        object (unlinked when it is freed, never before), another fetch an encoding made
        at the first such fetch."""
        if request.local and self.shm_pool is not None:
            cache = self._segments.setdefault(object_id, {})
            request.reply([STATUS_OK, value], shm_segments.StoredPlacer(
                cache, self.shm_threshold, self.shm_pool))
            if not cache:
                del self._segments[object_id]
            return
        frames = self._encoded.get(object_id)
        if frames is None:
            try:
                frames = self.codec.encode([STATUS_OK, value])
            except EncodeError:
                request.reply([STATUS_OK, value])  # replies with the encoding error
                return
            self._encoded[object_id] = frames
        request.reply_encoded(frames)

    def drop(self, object_id: bytes) -> None:
        """The object was freed: its replies go (its segments back to the pool)."""
        self._encoded.pop(object_id, None)
        cache = self._segments.pop(object_id, None)
        if cache:
            shm_segments.StoredPlacer.release(cache, self.shm_pool)

    def close(self) -> None:
        """Release the segments placed for stored objects (the pool is closed by now)."""
        for cache in self._segments.values():
            shm_segments.StoredPlacer.release(cache)  # unlinked: the pool is closed
        self._segments.clear()


class OwnedObjects:
    """This process's objects: :meth:`put` stores one, :meth:`on_fetch`, :meth:`on_wait`
    and :meth:`on_free` serve the protocol requests of other processes.

    Built from the loop's thread, the store, the fetch replies it keeps, the put buffer of
    the actor's executor, this process's endpoint (that of the refs it makes) and the
    function that frees an object when its ref is collected."""

    def __init__(self, loop: LoopThread, store: ObjectStore, replies: FetchReplies,
                 puts: PutBuffer, address: str, release: Release) -> None:
        self.loop = loop.loop
        self._on_loop = loop.on_loop
        self.store = store
        self.replies = replies
        self.puts = puts
        self.address = address
        """This process's endpoint: the owner of what it puts."""
        self._release = release

    # ---- put --------------------------------------------------------------------------------
    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` in this process and return a ref others can fetch (thread-safe):
        now on the loop; from the actor's executor thread, with the running method's
        result (:class:`PutBuffer`); else in the loop's next iteration."""
        ref = ObjectRef(new_object_id(), self.address, self._release)
        ref.became_ready((STATUS_OK, value))
        if self._on_loop():
            self.store.set(ref.id, STATUS_OK, value)
        elif self.puts.holds_this_thread():
            self.puts.pending.append((ref.id, value))
        else:
            self.loop.call_soon_threadsafe(self.store.set, ref.id, STATUS_OK, value)
        return ref

    # ---- serving ----------------------------------------------------------------------------
    def on_fetch(self, request: Request) -> None:
        """``__fetch__(object_id, free)``: reply ``[status, value]`` once it exists."""
        object_id, free = request.args
        store = self.store

        def send(status: int, value: Any) -> None:
            if not free and status == STATUS_OK and store.lookup(object_id) is not None:
                self.replies.send(request, object_id, value)
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

    def close(self) -> None:
        """Release the segments placed for stored objects (the pool is closed by now)."""
        self.replies.close()
