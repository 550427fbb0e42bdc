"""Pooled segments: reusable shared memory for data a sender copies out.

Call arguments, and stored objects fetched by others, are copied into a segment the owner
keeps mapped and reuses (:class:`SegmentPool`). The owner sets a lent byte of the
segment's header when it hands the segment to a receiver (the handle names it), the
receiver clears it when the last array it read from the segment is garbage collected
(:mod:`transport.shm.mappings`). A segment is reused only when it is neither in flight
(call not answered, object not freed) nor lent. Creating a fresh segment costs page
allocation (on this VM ~2.7 ms per 8 MiB, more than sending it through a ZeroMQ frame);
refilling a pooled one costs one ``memcpy``. Receivers cache the mappings of pooled
segments, so a refilled one costs them nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from transport.shm.segments import Segment

DEFAULT_POOL_BYTES = 256 * 2**20
"""Segment bytes a :class:`SegmentPool` keeps named at most (older ones are unlinked)."""
DEFAULT_POOL_IDLE_S = 10.0
"""Pooled segments unused this long are unlinked by :meth:`SegmentPool.trim`."""
_ALIGN = 64


class SegmentPool:
    """Reusable segments for data a sender copies out (call arguments).

    :meth:`acquire` returns a segment not in flight and not lent (its last receiver
    dropped what it read), creating one when none fits; :meth:`finish` hands it back when
    the call is answered or the stored object freed (``ok``), or unlinks it (the call
    failed: whether the receiver will ever read it is unknown). At most ``max_bytes`` of
    segments stay named: past that the least recently used ones not in flight are unlinked
    (a receiver still reading one keeps its mapping). Thread-safe.
    """

    def __init__(self, max_bytes: int = DEFAULT_POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._segments: list[Segment] = []  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()
        self.created = 0
        self.reused = 0

    def acquire(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes`` data bytes, marked in flight (lend it with
        :meth:`Segment.lend`). Raises OSError when none can be created (``/dev/shm``
        missing or full)."""
        need = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        with self._lock:
            for i, seg in enumerate(self._segments):
                if (not seg.in_flight and need <= seg.capacity <= 2 * need
                        and not seg.lent):
                    del self._segments[i]
                    self._segments.append(seg)
                    seg.in_flight = True
                    self.reused += 1
                    return seg
            self._evict(self.max_bytes - need)
        seg = Segment.create(need)
        seg.in_flight = True
        with self._lock:
            self._segments.append(seg)
            self._bytes += seg.capacity
            self.created += 1
        return seg

    def _evict(self, limit: int) -> None:
        """Unlink idle segments, oldest first, until at most ``limit`` bytes stay."""
        i = 0
        while self._bytes > limit and i < len(self._segments):
            seg = self._segments[i]
            if seg.in_flight:
                i += 1
                continue
            del self._segments[i]
            self._bytes -= seg.capacity
            seg.unlink()

    def finish(self, segments: Iterable[Segment], ok: bool) -> None:
        """The call that carried ``segments`` is over: reuse them (``ok``) or drop them."""
        now = time.monotonic()
        with self._lock:
            for seg in segments:
                seg.in_flight = False
                seg.used_at = now
                if not ok and seg in self._segments:
                    self._segments.remove(seg)
                    self._bytes -= seg.capacity
                    seg.unlink()

    def trim(self, max_idle_s: float = DEFAULT_POOL_IDLE_S) -> int:
        """Unlink the segments not in flight and unused for ``max_idle_s``; returns how
        many stay (a burst of big calls does not keep its memory named for good)."""
        limit = time.monotonic() - max_idle_s
        with self._lock:
            keep = []
            for seg in self._segments:
                if seg.in_flight or seg.used_at > limit:
                    keep.append(seg)
                else:
                    self._bytes -= seg.capacity
                    seg.unlink()
            self._segments = keep
            return len(keep)

    @property
    def nbytes(self) -> int:
        """Bytes of the segments the pool keeps named."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        """Unlink every segment of the pool."""
        with self._lock:
            segments, self._segments, self._bytes = self._segments, [], 0
        for seg in segments:
            seg.unlink()
