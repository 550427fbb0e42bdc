"""Placers: where the big arrays of one outgoing message go in shared memory.

The codec (:mod:`transport.codec`) asks a :class:`Placer` about each array at or above its
threshold (default :data:`DEFAULT_THRESHOLD`, 256 KiB) bound for a process on this host;
the placer puts it in a segment and returns a :data:`Handle` (segment name, offset, lent
slot), which the message carries instead of the array; None sends the array as a
zero-copy ZeroMQ frame (across hosts nothing else is used). :class:`CallPlacer` serves the
arguments of one call, :class:`StoredPlacer` a stored object answered to fetches. Arrays
allocated in a segment (:func:`transport.shm.arrays.empty`) go as they are.
"""

from __future__ import annotations

import numpy as np

from transport.shm.arrays import region_of
from transport.shm.pool import SegmentPool
from transport.shm.segments import Segment, warn_fallback

DEFAULT_THRESHOLD = 256 * 1024
"""Arrays of at least this many bytes go through shared memory to same-host peers."""

Handle = tuple[str, int, int]
"""``(segment name, data offset, lent slot + 1 or 0)``: what the wire carries instead of
an array; a receiver clears the lent byte it names once it dropped the data."""


class Placer:
    """Decides where the big arrays of one message go (the codec asks :meth:`place` for
    each array of at least :attr:`threshold` bytes; None means "as a ZeroMQ frame")."""

    threshold: int = DEFAULT_THRESHOLD

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """Put ``arr`` (whose bytes are the contiguous uint8 ``flat``) in shared memory and
        return its handle, or None to send it as a frame."""
        raise NotImplementedError


class CallPlacer(Placer):
    """Arrays of one outgoing call: copied into segments of ``pool`` (arrays allocated
    with :func:`empty` go as they are), all held until :meth:`finish`."""

    __slots__ = ("pool", "threshold", "segments", "keep")

    def __init__(self, pool: SegmentPool, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.pool = pool
        self.threshold = threshold
        self.segments: list[Segment] = []
        self.keep: list[np.ndarray] = []

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """See :meth:`Placer.place`."""
        found = region_of(arr)
        if found is not None:
            self.keep.append(arr)  # alive (named) until the call is answered
            return found[0].name, found[1], 0
        try:
            seg = self.pool.acquire(flat.nbytes)
        except OSError as exc:
            warn_fallback(exc)
            return None
        self.segments.append(seg)
        seg.write(flat)
        seg.lend(0)
        return seg.name, 0, 1

    def finish(self, ok: bool) -> None:
        """The call was answered (``ok``) or failed: release what it held."""
        if self.segments:
            self.pool.finish(self.segments, ok)
            self.segments = []
        self.keep = []


class StoredPlacer(Placer):
    """Arrays of a stored object answered to same-host fetches: each copied once into a
    segment of ``pool`` (or, without a pool, a segment of its own written with
    ``pwrite``), remembered in ``cache`` (keyed by the address and size of the array's
    bytes, which the stored object keeps alive) and handed to every later fetch through a
    lent byte of its own (:data:`~transport.shm.segments.SLOTS` fetchers at once; more
    get frames). When the object is freed the owner calls :meth:`release`: pooled segments
    go back to the pool (reused once every fetcher dropped its data), others are unlinked.
    One placer per reply."""

    __slots__ = ("cache", "threshold", "pool", "slots")

    def __init__(self, cache: dict[tuple[int, int], tuple[np.ndarray, Segment]],
                 threshold: int = DEFAULT_THRESHOLD, pool: SegmentPool | None = None) -> None:
        self.cache = cache
        self.threshold = threshold
        self.pool = pool
        self.slots: dict[str, int] = {}  # segment -> slot lent to this reply

    def place(self, arr: np.ndarray, flat: np.ndarray) -> Handle | None:
        """See :meth:`Placer.place`."""
        found = region_of(arr)
        key = (flat.__array_interface__["data"][0], flat.nbytes)
        if found is not None:
            self.cache.setdefault(key, (arr, found[0]))  # keeps it alive, not unlinked
            return found[0].name, found[1], 0
        hit = self.cache.get(key)
        if hit is None:
            try:
                if self.pool is not None:
                    seg = self.pool.acquire(flat.nbytes)
                    seg.write(flat)
                else:
                    seg = Segment.from_array(flat)
            except OSError as exc:
                warn_fallback(exc)
                return None
            # flat stays alive: its address is not reused while the entry exists
            hit = self.cache[key] = (flat, seg)
        seg = hit[1]
        if self.pool is None:
            return seg.name, 0, 0
        slot = self.slots.get(seg.name)
        if slot is None:
            slot = seg.free_slot()
            if slot is None:
                return None
            seg.lend(slot)
            self.slots[seg.name] = slot
        return seg.name, 0, slot + 1

    @staticmethod
    def release(cache: dict[tuple[int, int], tuple[np.ndarray, Segment]],
                pool: SegmentPool | None = None) -> None:
        """The object was freed: hand its pooled segments back to ``pool``, unlink the
        others it placed (arrays allocated with :func:`empty` unlink when collected)."""
        pooled = []
        for arr, seg in cache.values():
            if region_of(arr) is not None:
                continue
            if pool is not None and seg.in_flight:
                pooled.append(seg)
            else:
                seg.unlink()
        if pooled:
            pool.finish(pooled, ok=True)
        cache.clear()
