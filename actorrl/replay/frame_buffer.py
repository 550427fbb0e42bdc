"""Replay buffers that store each frame of frame-stacked observations once.

A transition of an Atari-like env holds ``obs`` and ``new_obs``, two stacks of 4 frames
(56 KB at 84x84), though consecutive transitions share all but one frame. Here the frames
live once in a circular :class:`FrameStore`; a transition keeps, per stacked column, the
absolute ids of its frames (``[stack]`` int64), and sampling rebuilds the stacks (as a
:class:`~actorrl.frames.FramePack` attached to the returned batch, so the learner gets the
frames once over the wire too). A Pong-like shard then costs about one frame (7 KB) per
transition instead of eight. With ``unpack=False`` (a replay shard that only sends what it
samples) the stacks are not rebuilt here at all: the batch holds them only as the pack
(:meth:`~actorrl.batch.SampleBatch.packed`) and the receiver rebuilds them.

Frames and transitions are both written in order, so when the frame ring wraps the
transitions whose frames it overwrote are the oldest ones: they are retired (never
sampled again, zero priority) before any of their frames could be served wrong. The ring
is sized from the first batch (frames per transition, plus headroom) unless
``frame_capacity`` is given; a smaller ring just retires transitions earlier.

With ``compress`` the frames are kept LZ4-compressed (:class:`FrameStore`).

Batches without frame-stack columns are stored as by the plain buffers.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from actorrl.batch import SampleBatch
from actorrl.frames import FramePack, pack_frames, packable_columns
from actorrl.replay.buffer import PrioritizedReplayBuffer, ReplayBuffer

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


class _FrameStacks:
    """The frame-store part shared by :class:`FrameReplayBuffer` and
    :class:`FramePrioritizedReplayBuffer` (mixed in before the plain buffer)."""

    _capacity: int
    _size: int
    _next_slot: int
    _storage: dict[str, np.ndarray]

    def _init_frames(self, frame_capacity: int | None, unpack: bool, compress: bool) -> None:
        self._frame_capacity = frame_capacity
        self._unpack = unpack
        self._compress = compress
        if compress:
            _lz4_block()  # fail at construction, not at the first add
        self.frame_store: FrameStore | None = None
        self._frame_columns: tuple[str, ...] = ()
        self._axis = 0
        self._retired = 0  # oldest rows held whose frames were overwritten

    # ---- writing -------------------------------------------------------------------------
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
                self._capacity * max(per_row, 1.0 / len(pack.indices)) * FRAME_HEADROOM
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

    def _write(self, batch: SampleBatch) -> tuple[int, int]:
        stored = self._to_stored(batch)
        overwritten = max(0, self._size + stored.count - self._capacity)
        self._retired = max(0, self._retired - overwritten)
        result = super()._write(stored)  # type: ignore[misc]
        if self.frame_store is not None:
            self._retire_overwritten()
        return result

    def _oldest_slot(self) -> int:
        return (self._next_slot - self._size) % self._capacity

    def _retire_overwritten(self) -> None:
        """Retire the oldest rows that refer to frames the ring has overwritten."""
        assert self.frame_store is not None
        floor = self.frame_store.floor
        min_ids = self._storage[_MIN_ID]
        start = self._retired
        while start < self._size:
            chunk = np.arange(start, min(self._size, start + 4096))
            slots = (self._oldest_slot() + chunk) % self._capacity
            stale = min_ids[slots] < floor
            if stale.all():
                start = int(chunk[-1]) + 1
                continue
            start = int(chunk[0] + np.argmin(stale))
            break
        if start > self._retired:
            slots = (self._oldest_slot() + np.arange(self._retired, start)) % self._capacity
            self._on_retired(slots)
            self._retired = start

    def _on_retired(self, slots: np.ndarray) -> None:
        """Rows at ``slots`` were retired (the prioritized buffer zeroes their mass)."""

    @property
    def num_live(self) -> int:
        """Rows that can be sampled (held and not retired)."""
        return self._size - self._retired

    def is_retired(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether it is among the oldest ones retired (no longer sampled)."""
        return (np.asarray(slots) - self._oldest_slot()) % self._capacity < self._retired

    # ---- reading -------------------------------------------------------------------------
    def _from_stored(self, columns: dict[str, np.ndarray]) -> SampleBatch:
        """Stored rows with their frame-id columns turned back into frame stacks."""
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

    def _gather(self, slots: np.ndarray, skip: tuple[str, ...] = ()) -> SampleBatch:
        batch = super()._gather(slots, skip)  # type: ignore[misc]
        return self._from_stored(dict(dict.items(batch)))

    def rows_at(self, slots: np.ndarray) -> SampleBatch:
        """The stored rows at ``slots``, not counted as sampled."""
        return self._from_stored(dict(dict.items(super().rows_at(slots))))  # type: ignore[misc]

    def frame_stats(self) -> dict[str, Any]:
        """Frame-store figures for ``stats``."""
        store = self.frame_store
        if store is None:
            return {}
        held = sum(a.nbytes for a in self._storage.values()) + store.nbytes
        return {"frame_capacity": store.capacity, "frames_written": store.written,
                "num_retired": self._retired,
                "bytes_per_transition": held / self._capacity}


class FrameReplayBuffer(_FrameStacks, ReplayBuffer):
    """:class:`~actorrl.replay.ReplayBuffer` storing each frame once (see the module
    docstring); uniform sampling over the live rows."""

    def __init__(self, capacity: int, *, frame_capacity: int | None = None,
                 unpack: bool = True, compress: bool = False,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(capacity, seed=seed)
        self._init_frames(frame_capacity, unpack, compress)

    def sample(self, num_items: int) -> SampleBatch:
        """``num_items`` live rows drawn uniformly with replacement, plus
        ``batch_indexes``."""
        self._check_can_sample(num_items)
        live = self.num_live
        if live == 0:
            raise ValueError("cannot sample: every row refers to overwritten frames")
        offsets = np.minimum((self._rng.random(num_items) * live).astype(np.int64), live - 1)
        slots = (self._next_slot - live + offsets) % self._capacity
        return self._gather(slots)

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """The plain stats plus the frame store's."""
        return {**super().stats(debug), **self.frame_stats()}


class FramePrioritizedReplayBuffer(_FrameStacks, PrioritizedReplayBuffer):
    """:class:`~actorrl.replay.PrioritizedReplayBuffer` storing each frame once; a retired
    row has zero mass, so it is never sampled, and later priority updates leave it so."""

    def __init__(self, capacity: int, alpha: float, eps: float = 1e-6, *,
                 frame_capacity: int | None = None, unpack: bool = True,
                 compress: bool = False,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(capacity, alpha, eps, seed=seed)
        self._init_frames(frame_capacity, unpack, compress)

    def _on_retired(self, slots: np.ndarray) -> None:
        self._sum_tree.update(slots, 0.0, unique=True)
        self._min_tree.update(slots, math.inf, unique=True)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """As the plain buffer's, skipping retired rows."""
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        if self._retired and indices.ndim == 1 and indices.shape == priorities.shape \
                and len(indices) and indices.dtype.kind in "iu":
            keep = ~self.is_retired(indices)
            indices, priorities = indices[keep], priorities[keep]
        super().update_priorities(indices, priorities)

    def sample(self, num_items: int, beta: float = 0.4) -> SampleBatch:  # type: ignore[override]
        """As the plain buffer's, over the live rows."""
        if self.num_live == 0 and self._size:
            raise ValueError("cannot sample: every row refers to overwritten frames")
        return super().sample(num_items, beta)

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """The plain stats plus the frame store's."""
        return {**super().stats(debug), **self.frame_stats()}
