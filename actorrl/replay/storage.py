"""Where a replay buffer keeps its rows: the :class:`Storage` protocol and its plain form,
:class:`RowStorage` (one preallocated numpy array per column).

A storage is a ring of ``capacity`` slots written in order, oldest overwritten first. The
oldest rows held may be *retired* (kept but never sampled again, as the frame storage does
with rows whose frames it overwrote): the rows that can be sampled are always the newest
``num_live`` ones. Samplers see a storage only through this protocol.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import numpy as np

from actorrl.data.batch import SampleBatch

_NO_SLOTS = np.zeros(0, dtype=np.int64)


class Written(NamedTuple):
    """What one :meth:`Storage.write` did to the slots (a tuple: cheap to make per add)."""

    first_slot: int
    """Slot of the first row written; the others follow it modulo the capacity."""
    count: int
    """Rows written (at most the capacity: a larger batch keeps only its last rows)."""
    skipped: int
    """Leading rows of the batch not written (overwritten within the batch itself)."""
    segments: tuple[tuple[int, int, int], ...]
    """The written slots as contiguous ``(start, stop, offset)`` pieces (at most two),
    ``offset`` being the first piece row's position among the ``count`` rows."""
    evicted: np.ndarray = _NO_SLOTS
    """Slots whose rows were overwritten, oldest first."""
    retired: np.ndarray = _NO_SLOTS
    """Slots retired by this write (still held, never sampled again)."""

    def slots(self, capacity: int) -> np.ndarray:
        """The written slots, in row order (int64)."""
        return (self.first_slot + np.arange(self.count)) % capacity


class Storage(Protocol):
    """The rows of a replay buffer (see the module docstring). Not thread-safe."""

    def bind(self, capacity: int) -> None:
        """Size the storage for ``capacity`` rows; called once, by the buffer owning it."""

    @property
    def capacity(self) -> int:
        """Slots in the ring."""

    def __len__(self) -> int:
        """Rows held (live or retired)."""

    @property
    def num_live(self) -> int:
        """Rows that can be sampled: the newest ``num_live`` rows held."""

    def live_slots(self, offsets: np.ndarray) -> np.ndarray:
        """Slots of the live rows at ``offsets`` (each in ``[0, num_live)``), int64."""

    def is_retired(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether it holds a retired row."""

    def write(self, batch: SampleBatch) -> Written:
        """Append ``batch``'s rows, overwriting the oldest once full."""

    def take(self, slots: np.ndarray, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The stored columns (less ``skip``) at ``slots`` (held slots), as stored."""

    def to_batch(self, columns: dict[str, np.ndarray]) -> SampleBatch:
        """Columns from :meth:`take` (plus any added) as the batch a sampler returns."""

    def stats(self) -> dict[str, Any]:
        """Size figures for the buffer's ``stats``."""


class RowStorage:
    """Columnar rows: one ``capacity``-row array per column, allocated on the first write
    from that batch's dtypes and row shapes. A batch is written with at most two slice
    copies per column; :meth:`take` is one gather per column. Every batch written must
    have the columns, dtypes (up to a same-kind cast) and row shapes of the first one.
    """

    def __init__(self) -> None:
        self._capacity = 0
        self._columns: dict[str, np.ndarray] = {}
        self._next_slot = 0
        self._size = 0
        self._retired = 0

    def bind(self, capacity: int) -> None:
        """Size the ring for ``capacity`` rows (once)."""
        if self._capacity:
            raise ValueError("this storage already belongs to a replay buffer")
        self._capacity = int(capacity)

    @property
    def capacity(self) -> int:
        """Slots in the ring."""
        return self._capacity

    def __len__(self) -> int:
        """Rows held."""
        return self._size

    @property
    def columns(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Stored columns: name -> (dtype, row shape); empty before the first write."""
        return {name: (arr.dtype, arr.shape[1:]) for name, arr in self._columns.items()}

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The stored column arrays themselves (``capacity`` rows each; read them only)."""
        return self._columns

    @property
    def num_live(self) -> int:
        """Rows held and not retired."""
        return self._size - self._retired

    @property
    def num_retired(self) -> int:
        """The oldest rows held that are retired."""
        return self._retired

    def oldest_slot(self) -> int:
        """Slot of the oldest row held."""
        return (self._next_slot - self._size) % self._capacity

    def live_slots(self, offsets: np.ndarray) -> np.ndarray:
        """Slots of the live rows at ``offsets``."""
        if self._retired == 0:  # every slot in [0, len) holds a live row
            return offsets
        return (self._next_slot - self.num_live + offsets) % self._capacity

    def is_retired(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether it is among the oldest rows, retired."""
        return (np.asarray(slots) - self.oldest_slot()) % self._capacity < self._retired

    def retire_oldest(self, count: int) -> np.ndarray:
        """Retire the ``count`` oldest live rows; returns their slots."""
        count = min(count, self.num_live)
        slots = (self.oldest_slot() + np.arange(self._retired, self._retired + count)) \
            % self._capacity
        self._retired += count
        return slots

    def write(self, batch: SampleBatch) -> Written:
        """Store ``batch``'s rows; only its last ``capacity`` rows when it holds more
        (sequential adds would have overwritten the others)."""
        count = batch.count
        if count == 0:
            return Written(self._next_slot, 0, 0, ())
        if not self._columns:
            self._allocate(batch)
        else:
            self._check_columns(batch)
        capacity = self._capacity
        written = min(count, capacity)
        skipped = count - written
        evicted = self._evicted_slots(count)
        first_slot = (self._next_slot + skipped) % capacity
        segments = wrapped_segments(first_slot, written, capacity)
        # dict.items: SampleBatch.__getitem__ is a Python-level override, slow per call.
        for name, values in dict.items(batch):
            column = self._columns[name]
            for start, stop, offset in segments:
                column[start:stop] = values[skipped + offset: skipped + offset + stop - start]
        self._retired = max(0, self._retired - max(0, self._size + count - capacity))
        self._next_slot = (self._next_slot + count) % capacity
        self._size = min(self._size + count, capacity)
        return Written(first_slot, written, skipped, segments, evicted)

    def _evicted_slots(self, count: int) -> np.ndarray:
        """Slots of the held rows that ``count`` new rows overwrite, oldest first."""
        evicted = min(self._size, self._size + count - self._capacity)
        if evicted <= 0:
            return _NO_SLOTS
        # Before the ring is full it fills from slot 0, so the first eviction hits slot 0.
        first = self._next_slot if self._size == self._capacity else 0
        if first + evicted <= self._capacity:
            return np.arange(first, first + evicted)
        return (first + np.arange(evicted)) % self._capacity

    def take(self, slots: np.ndarray, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The stored columns at ``slots``, one gather per column."""
        return {name: column.take(slots, axis=0)
                for name, column in self._columns.items() if name not in skip}

    def to_batch(self, columns: dict[str, np.ndarray]) -> SampleBatch:
        """The columns as they are."""
        return SampleBatch(columns)

    def stats(self) -> dict[str, Any]:
        """``est_size_bytes``: bytes of the rows held; ``allocated_bytes``: bytes of the
        preallocated columns; ``num_entries``: rows held."""
        return {"est_size_bytes": self._size * self._row_nbytes(),
                "allocated_bytes": self.allocated_bytes, "num_entries": self._size}

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the preallocated column arrays."""
        return sum(arr.nbytes for arr in self._columns.values())

    def _row_nbytes(self) -> int:
        return sum(arr.itemsize * math.prod(arr.shape[1:]) for arr in self._columns.values())

    def _allocate(self, batch: SampleBatch) -> None:
        """Create one ``capacity``-row array per column of ``batch`` (all or none)."""
        columns = {}
        for name, values in dict.items(batch):
            if values.ndim == 0:
                raise ValueError(
                    f"column {name!r} is a scalar; every column needs one row per step")
            columns[name] = np.empty((self._capacity, *values.shape[1:]), values.dtype)
        self._columns = columns

    def _check_columns(self, batch: SampleBatch) -> None:
        """Raise ValueError unless ``batch`` has the stored columns, row shapes and dtypes."""
        stored = self._columns
        if len(batch) != len(stored) or not all(name in stored for name in batch):
            missing = sorted(stored.keys() - batch.keys())
            extra = sorted(batch.keys() - stored.keys())
            raise ValueError(
                f"batch columns differ from the buffer's: missing {missing}, unexpected {extra}")
        for name, values in dict.items(batch):
            column = stored[name]
            if values.dtype is column.dtype and values.shape[1:] == column.shape[1:]:
                continue
            if values.shape[1:] != column.shape[1:]:
                raise ValueError(f"column {name!r} rows have shape {values.shape[1:]}, "
                                 f"the buffer stores {column.shape[1:]}")
            if values.dtype != column.dtype and not np.can_cast(
                    values.dtype, column.dtype, casting="same_kind"):
                raise ValueError(f"column {name!r} has dtype {values.dtype}, "
                                 f"which does not cast safely to the stored {column.dtype}")


def wrapped_segments(first_slot: int, count: int,
                     capacity: int) -> tuple[tuple[int, int, int], ...]:
    """Slots ``first_slot .. first_slot + count - 1`` modulo capacity, as contiguous pieces.

    Returns ``(start, stop, offset)`` triples, ``offset`` being the first row's position
    among the ``count`` rows; at most two pieces.
    """
    if count == 0:
        return ()
    head = min(count, capacity - first_slot)
    if count > head:
        return (first_slot, first_slot + head, 0), (0, count - head, head)
    return ((first_slot, first_slot + head, 0),)
