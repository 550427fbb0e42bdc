"""The batched-free queue: frees this process sends to the owners of objects it let go.

A free of a collected ref (or of a ``get_and_free``) waits up to :data:`FREE_DELAY_S`; a
request this process sends to the owner meanwhile takes it along (one ZeroMQ message, see
:class:`transport.rpc.Outbox`), so steady traffic sends no free messages of its own (each
message wakes both processes). An explicit ``free`` goes in the next loop iteration.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from actorrl.runtime.process.loop import LoopThread
from actorrl.runtime.process.peers import Peers
from actorrl.runtime.process.refs import ObjectRef

log = logging.getLogger(__name__)

FREE_DELAY_S = 0.05
"""Frees of garbage-collected refs (and those of ``get_and_free``) wait up to this long
for a request to their owner to ride with."""
FREE_RIDE_AGE_S = 0.005
"""Queued frees ride along with a request once the oldest has waited this long (so a run
of quick calls takes them every few ms, not one free per call)."""
FREE_BATCH = 1024
"""Past this many queued frees they go at once."""


class FreeQueue:
    """Frees waiting to be sent, by owner (:meth:`free` and :meth:`release` from any
    thread; the rest on the loop). :attr:`queue` is never replaced, so the caller side may
    hold it.

    Built from the loop's thread, the peers it sends through (or whose stores it frees in
    directly), and ``before_loop_request``, called off the loop before an explicit free
    (see :meth:`PutBuffer.flush_soon <actorrl.runtime.process.owned.PutBuffer.flush_soon>`).
    """

    def __init__(self, loop: LoopThread, peers: Peers,
                 before_loop_request: Callable[[], None]) -> None:
        self.loop = loop.loop
        self._on_loop = loop.on_loop
        self._peers = peers
        self._before_loop_request = before_loop_request
        self.queue: deque[tuple[str, bytes]] = deque()
        """(owner, object id) of the frees not sent yet."""
        self._flush_scheduled = False
        self._timer_armed = False
        self._since = 0.0
        """Loop time when the queued frees started to wait (about: set from any thread)."""
        self.closed = False

    def free(self, refs: ObjectRef | Iterable[ObjectRef], soon: bool = True) -> None:
        """Release objects at their owners now (thread-safe); ``soon=False``: within
        :data:`FREE_DELAY_S`, with the next request to the owner."""
        if isinstance(refs, ObjectRef):
            refs = [refs]
        if not self._on_loop():
            self._before_loop_request()
        for ref in refs:
            ref.mark_freed()
            self.release(ref.owner, ref.id, soon)

    def release(self, owner: str, object_id: bytes, soon: bool = True) -> None:
        """Queue a free of ``object_id`` at ``owner``; batched, any thread. ``soon``:
        send it in the next loop iteration; otherwise (a ref that was garbage-collected, a
        ``get_and_free``) with the next request to ``owner`` or within
        :data:`FREE_DELAY_S`, together with the others of that time."""
        frees = self.queue
        if not frees:
            self._since = self.loop.time()
        frees.append((owner, object_id))
        if self._flush_scheduled or self.closed:
            return
        if soon or len(frees) >= FREE_BATCH:
            self._flush_scheduled = True
            if self._on_loop():
                self.loop.call_soon(self.flush)
            else:
                self.loop.call_soon_threadsafe(self.flush)
        elif not self._timer_armed:
            self._timer_armed = True
            if self._on_loop():
                self.loop.call_later(FREE_DELAY_S, self._timer_fired)
            else:
                self.loop.call_soon_threadsafe(self.loop.call_later, FREE_DELAY_S,
                                               self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer_armed = False
        if not self.closed:
            self.flush()

    def ride_with(self, owner: str) -> None:
        """Before a call to ``owner``: its queued frees go in the same message, once they
        waited :data:`FREE_RIDE_AGE_S` (or many are queued). (Before a fetch or wait they
        always do.)"""
        if (len(self.queue) >= FREE_BATCH // 16
                or self.loop.time() - self._since >= FREE_RIDE_AGE_S):
            self.flush(owner)

    def close(self) -> None:
        """Send nothing from now on (the runtime is closing; flush first)."""
        self.closed = True

    def flush(self, only: str | None = None) -> None:
        """Send the queued frees (``only``: those of that owner, just before a request
        to it, so they travel in the same ZeroMQ message)."""
        if only is None:
            self._flush_scheduled = False
        by_owner: dict[str, list[bytes]] = {}
        others = []
        frees = self.queue
        while frees:  # popleft: other threads may append meanwhile
            owner, object_id = frees.popleft()
            if only is None or owner == only:
                by_owner.setdefault(owner, []).append(object_id)
            else:
                others.append((owner, object_id))
        if others:
            frees.extend(others)
            self._since = self.loop.time()
        peers = self._peers
        for owner, ids in by_owner.items():
            store = peers.stores.get(owner)
            if store is not None:
                for object_id in ids:
                    store.free(object_id)
            elif owner not in peers.dead and not self.closed:
                try:
                    # Before a request: held, so both travel in one message.
                    peers.client(owner).notify("__free__", [ids], hold=only is not None)
                except Exception as exc:  # a free is best effort
                    log.debug("could not send free to %s: %s", owner, exc)
