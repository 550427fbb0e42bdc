"""Numpy arrays over shared-memory segments, and *allocated* segments.

Every array read from or built in a segment has a :class:`Region` as its base: it keeps
the mapping alive as long as any array (or view) over it is, and knows the segment it came
from. A producer may build its array directly in a segment of its own (:func:`empty`):
sent to a same-host peer it travels as a handle, so sending copies nothing
(:func:`region_of` finds the segment). The segment is unlinked when the producer's array
is garbage collected.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from transport.shm.segments import HEADER_BYTES, Segment


class Region:
    """Base object of arrays over a mapping: keeps the mapping alive as long as any array
    (or view) over it is, and knows the segment it came from (None for a received one)."""

    __slots__ = ("__array_interface__", "segment", "name", "address", "mm", "__weakref__")


def region_array(keep: object, address: int, name: str, segment: Segment | None,
                 offset: int, nbytes: int, readonly: bool) -> tuple[Region, np.ndarray]:
    """A uint8 array over data bytes ``[offset, offset + nbytes)`` of the segment ``name``
    mapped at ``address``, and its :class:`Region`; ``keep`` (the mapping, or what holds
    it) stays alive as long as the array does."""
    region = Region()
    region.segment = segment
    region.name = name
    region.address = address
    region.mm = keep
    region.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                  "data": (address + HEADER_BYTES + offset, readonly)}
    return region, np.asarray(region)


def empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A new writable C-contiguous array allocated in a shared-memory segment owned by this
    process: sent to a same-host peer it travels as a handle, with no copy at all (e.g. a
    replay shard gathering a sampled batch into it). The segment is unlinked when the array
    (and every view of it) is garbage collected; receivers that mapped it keep their
    mapping. Raises OSError when ``/dev/shm`` cannot hold it."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    segment = Segment.create(max(nbytes, 1))
    region, flat = region_array(segment.mm, segment.address, segment.name, segment, 0,
                                nbytes, readonly=False)
    weakref.finalize(region, segment.unlink)
    return flat.view(dtype).reshape(shape)


def region_of(arr: np.ndarray) -> tuple[Segment, int] | None:
    """``(segment, data offset)`` when ``arr`` lies in a segment this process allocated
    with :func:`empty`, else None."""
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is not Region or base.segment is None or base.segment.unlinked:
        return None
    offset = arr.__array_interface__["data"][0] - base.address - HEADER_BYTES
    if offset < 0 or offset + arr.nbytes > base.segment.capacity:
        return None
    return base.segment, offset
