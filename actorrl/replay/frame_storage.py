"""A replay storage that keeps each frame of frame-stacked observations once.

A transition of an Atari-like env holds ``obs`` and ``new_obs``, two stacks of 4 frames
(56 KB at 84x84), though consecutive transitions share all but one frame. Here the frames
live once in a circular :class:`FrameStore`; a transition keeps, per stacked column, the
absolute ids of its frames (``[stack]`` int64), and sampling rebuilds the stacks (as a
:class:`~actorrl.data.frames.FramePack` attached to the returned batch, so the learner gets the
frames once over the wire too). A Pong-like shard then costs about one frame (7 KB) per
transition instead of eight. With ``unpack=False`` (a replay shard that only sends what it
samples) the stacks are not rebuilt here at all: the batch holds them only as the pack
(:meth:`~actorrl.data.batch.SampleBatch.packed`) and the receiver rebuilds them.

Frames and transitions are both written in order, so when the frame ring wraps the
transitions whose frames it overwrote are the oldest ones: they are retired (never
sampled again, zero priority) before any of their frames could be served wrong. The ring
is sized from the first batch (frames per transition, plus headroom) unless
``frame_capacity`` is given; a smaller ring just retires transitions earlier.

With ``compress`` the frames are kept LZ4-compressed (:class:`FrameStore`).

Batches without frame-stack columns are stored as :class:`RowStorage` stores them.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from actorrl.data.batch import SampleBatch
from actorrl.data.frames import FramePack, pack_frames, packable_columns
from actorrl.replay.storage import RowStorage, Written

FRAME_HEADROOM = 1.15
"""Frame ring size over what the first batch's frames-per-transition needs."""
_IDS = "@frames"
_BYTES_OBJECT_OVERHEAD = sys.getsizeof(b"")
_MIN_ID = "\x00min_frame"


class FrameStore:
    """A circular store of single frames addressed by absolute ids (0, 1, 2, ... in write
    order); the newest ``capacity`` frames are held.

    With ``compress`` each frame is kept LZ4-compressed (Atari frames shrink 10-30x; each
    frame costs ~3 us to compress when added and ~5 us to decompress when sampled): the
    ``compress`` extra (``pip install -e ".[compress]"``).
    """

    def __init__(self, capacity: int, compress: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a frame store needs capacity >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.written = 0
        self._frames: np.ndarray | None = None
        self._lz4 = _lz4_block() if compress else None
        self._blobs: list[bytes] = []
        self._blob_bytes = 0
        self._frame_shape: tuple[int, ...] = ()

    @property
    def floor(self) -> int:
        """The oldest id still held."""
        return max(0, self.written - self.capacity)

    @property
    def compressed(self) -> bool:
        """Whether frames are kept LZ4-compressed."""
        return self._lz4 is not None

    @property
    def nbytes(self) -> int:
        """Bytes held for frames (compressed: the blobs, their object headers and the
        ring's references)."""
        if self._lz4 is not None:
            return self._blob_bytes + (_BYTES_OBJECT_OVERHEAD + 8) * len(self._blobs)
        return 0 if self._frames is None else self._frames.nbytes

    def append(self, frames: np.ndarray) -> int:
        """Store ``frames`` ``[M, *frame_shape]``; returns the id of the first."""
        if len(frames) > self.capacity:
            raise ValueError(f"{len(frames)} frames do not fit a frame store of "
                             f"{self.capacity}; raise its capacity")
        if self.written == 0:
            self._frame_shape = frames.shape[1:]
        elif frames.shape[1:] != self._frame_shape:
            raise ValueError(f"frames of shape {frames.shape[1:]} do not match the stored "
                             f"{self._frame_shape}")
        first = self.written
        if self._lz4 is not None:
            self._append_compressed(np.ascontiguousarray(frames))
        else:
            if self._frames is None:
                self._frames = np.empty((self.capacity, *frames.shape[1:]), frames.dtype)
            start = first % self.capacity
            head = min(len(frames), self.capacity - start)
            self._frames[start:start + head] = frames[:head]
            self._frames[:len(frames) - head] = frames[head:]
        self.written += len(frames)
        return first

    def _append_compressed(self, frames: np.ndarray) -> None:
        assert self._lz4 is not None
        compress = self._lz4.compress
        for offset, frame in enumerate(frames):
            blob = compress(frame, store_size=False)
            slot = (self.written + offset) % self.capacity
            if slot < len(self._blobs):
                self._blob_bytes -= len(self._blobs[slot])
                self._blobs[slot] = blob
            else:
                self._blobs.append(blob)
            self._blob_bytes += len(blob)

    def get(self, ids: np.ndarray) -> np.ndarray:
        """The frames with absolute ``ids`` (each must still be held)."""
        if self._lz4 is None:
            assert self._frames is not None
            return self._frames.take(ids, axis=0, mode="wrap")
        out = np.empty((len(ids), *self._frame_shape), np.uint8)
        size = out[0].nbytes if len(ids) else 0
        decompress, blobs, rows = self._lz4.decompress, self._blobs, out.reshape(len(ids), -1)
        for row, slot in enumerate((np.asarray(ids) % self.capacity).tolist()):
            rows[row] = np.frombuffer(decompress(blobs[slot], uncompressed_size=size),
                                      np.uint8)
        return out


def _lz4_block() -> Any:
    """The ``lz4.block`` module, or an ImportError saying how to install it."""
    try:
        import lz4.block
    except ImportError:
        raise ImportError("compressed replay frames need the lz4 package: "
                          'pip install -e ".[compress]" (or pip install lz4)') from None
    return lz4.block



class FrameStackStorage:
    """A :class:`~actorrl.replay.storage.Storage` keeping each frame of frame-stacked
    observations once (see the module docstring) over a :class:`RowStorage` of the other
    columns and the frame ids; batches without frame-stack columns are stored plainly."""

    def __init__(self, *, frame_capacity: int | None = None, unpack: bool = True,
                 compress: bool = False) -> None:
        if compress:
            _lz4_block()  # fail at construction, not at the first add
        self._frame_capacity = frame_capacity
        self._unpack = unpack
        self._compress = compress
        self._rows = RowStorage()
        self.frame_store: FrameStore | None = None
        """The frames, once the first frame-stack batch arrived (None before, or for
        batches without frame stacks)."""
        self._frame_columns: tuple[str, ...] = ()
        self._axis = 0

    def bind(self, capacity: int) -> None:
        """Size the rows for ``capacity`` transitions (once)."""
        self._rows.bind(capacity)

    @property
    def capacity(self) -> int:
        """Transition slots."""
        return self._rows.capacity

    def __len__(self) -> int:
        """Transitions held."""
        return len(self._rows)

    @property
    def num_live(self) -> int:
        """Transitions whose frames are all still held."""
        return self._rows.num_live

    def live_slots(self, offsets: np.ndarray) -> np.ndarray:
        """Slots of the live transitions at ``offsets``."""
        return self._rows.live_slots(offsets)

    def is_retired(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether its transition lost frames (never sampled again)."""
        return self._rows.is_retired(slots)

    # ---- writing -------------------------------------------------------------------------
    def write(self, batch: SampleBatch) -> Written:
        """Append the frames once and the transitions as frame ids; retire the oldest
        transitions whose frames the ring overwrote."""
        written = self._rows.write(self._to_stored(batch))
        if self.frame_store is None:
            return written
        return written._replace(retired=self._retire_overwritten())

    def _to_stored(self, batch: SampleBatch) -> SampleBatch:
        """``batch`` with its frame-stack columns replaced by frame-id columns."""
        pack = batch.frame_pack
        if pack is None:
            packable = packable_columns(batch)
            if packable is None:
                if self.frame_store is not None:
                    raise ValueError("this replay buffer stores frame stacks; the batch has "
                                     "no frame-stack columns")
                return batch
            names, axis = packable
            pack = pack_frames({name: batch[name] for name in names}, axis)
        if self.frame_store is None:
            per_row = len(pack.frames) / max(pack.count, 1)
            capacity = self._frame_capacity or math.ceil(
                self.capacity * max(per_row, 1.0 / len(pack.indices)) * FRAME_HEADROOM
                + 2 * len(pack.frames))
            self.frame_store = FrameStore(capacity, self._compress)
            self._frame_columns, self._axis = tuple(pack.indices), pack.axis
        elif tuple(pack.indices) != self._frame_columns:
            raise ValueError(f"batch frame columns {list(pack.indices)} differ from the "
                             f"stored {list(self._frame_columns)}")
        first = self.frame_store.append(pack.frames)
        columns = {k: v for k, v in dict.items(batch) if k not in pack.indices}
        min_id = None
        for name, ix in pack.indices.items():
            ids = ix.astype(np.int64) + first
            columns[name + _IDS] = ids
            low = ids.min(axis=1)
            min_id = low if min_id is None else np.minimum(min_id, low)
        columns[_MIN_ID] = min_id
        return SampleBatch(columns)

    def _retire_overwritten(self) -> np.ndarray:
        """Retire the oldest rows that refer to frames the ring has overwritten; returns
        their slots."""
        assert self.frame_store is not None
        rows = self._rows
        floor = self.frame_store.floor
        min_ids = rows.arrays[_MIN_ID]
        start = rows.num_retired
        while start < len(rows):
            chunk = np.arange(start, min(len(rows), start + 4096))
            slots = (rows.oldest_slot() + chunk) % rows.capacity
            stale = min_ids[slots] < floor
            if stale.all():
                start = int(chunk[-1]) + 1
                continue
            start = int(chunk[0] + np.argmin(stale))
            break
        return rows.retire_oldest(start - rows.num_retired)

    # ---- reading -------------------------------------------------------------------------
    def take(self, slots: np.ndarray, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The stored columns at ``slots`` (frame stacks still as frame ids)."""
        return self._rows.take(slots, skip)

    def to_batch(self, columns: dict[str, np.ndarray]) -> SampleBatch:
        """Stored rows with their frame-id columns turned back into frame stacks (as a
        pack only, with ``unpack=False``)."""
        if self.frame_store is None:
            return SampleBatch(columns)
        columns.pop(_MIN_ID, None)
        ids = [columns.pop(name + _IDS) for name in self._frame_columns]
        unique, inverse = np.unique(np.stack(ids), return_inverse=True)
        assert unique.size == 0 or unique[0] >= self.frame_store.floor, "stale frame served"
        inverse = inverse.reshape(len(ids), *ids[0].shape).astype(np.int32)
        pack = FramePack(self.frame_store.get(unique),
                         {name: inverse[i] for i, name in enumerate(self._frame_columns)},
                         self._axis)
        if self._unpack:
            return SampleBatch.from_frame_pack(columns, pack)
        return SampleBatch.packed(columns, pack)

    def stats(self) -> dict[str, Any]:
        """The row figures plus the frame store's (once it exists)."""
        out = self._rows.stats()
        store = self.frame_store
        if store is not None:
            held = self._rows.allocated_bytes + store.nbytes
            out.update(frame_capacity=store.capacity, frames_written=store.written,
                       num_retired=self._rows.num_retired,
                       bytes_per_transition=held / self.capacity)
        return out
