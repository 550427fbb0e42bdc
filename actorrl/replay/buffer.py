"""The replay buffer: a :class:`~actorrl.replay.storage.Storage` (where rows live) and a
:class:`~actorrl.replay.sampler.Sampler` (which rows to draw), composed.

``ReplayBuffer(capacity)`` stores plain rows and samples uniformly;
``ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6))`` is proportional
prioritized replay; ``storage=FrameStackStorage()`` keeps each frame of frame-stacked
observations once. The buffer checks what callers pass, counts what it adds and samples,
gathers sampled rows from the storage and tells the sampler what changed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from actorrl.data.batch import SampleBatch
from actorrl.replay.sampler import Sampler, UniformSampler
from actorrl.replay.storage import RowStorage, Storage, Written
from actorrl.util.stats import WindowStat

EVICTED_HIT_WINDOW = 1000
"""How many evicted rows' sample counts ``stats(debug=True)`` summarises."""


class ReplayBuffer:
    """Fixed-capacity FIFO replay buffer: rows in ``storage`` (default
    :class:`RowStorage`), drawn by ``sampler`` (default :class:`UniformSampler`).

    Once full, each new row overwrites the oldest. ``sample`` returns the stored columns
    plus ``batch_indexes`` (the storage slot of each row, int64) and, when the sampler
    weights its draws, ``weights``. Not thread-safe.
    """

    def __init__(self, capacity: int, *, sampler: Sampler | None = None,
                 storage: Storage | None = None,
                 seed: int | np.random.Generator | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        self.storage: Storage = RowStorage() if storage is None else storage
        """Where the rows live."""
        self.sampler: Sampler = UniformSampler() if sampler is None else sampler
        """Which rows are drawn."""
        self.storage.bind(self._capacity)
        self.sampler.bind(self._capacity)
        self._rng = np.random.default_rng(seed)
        self._num_added = 0
        self._num_sampled = 0
        self._hit_count = np.zeros(self._capacity, dtype=np.int64)
        self._evicted_hit_stats = WindowStat("evicted_hit", EVICTED_HIT_WINDOW)

    @property
    def capacity(self) -> int:
        """Maximum number of rows held."""
        return self._capacity

    def __len__(self) -> int:
        """Number of rows held."""
        return len(self.storage)

    def add_batch(self, batch: SampleBatch, priorities: np.ndarray | None = None) -> None:
        """Append all rows of ``batch``, overwriting the oldest rows once full; with
        ``priorities`` (one per row: Ape-X's worker-side initial priorities) the new rows
        get those instead of the sampler's default."""
        written = self.storage.write(batch)
        self._count_write(written)
        if len(written.retired):
            self.sampler.on_retire(written.retired)
        if priorities is None:
            self.sampler.on_write(written)
        else:
            values = np.asarray(priorities, dtype=np.float64)[batch.count - written.count:]
            self.update_priorities(written.slots(self._capacity), values)

    def sample(self, num_items: int) -> SampleBatch:
        """``num_items`` live rows as the sampler draws them (with replacement), plus
        ``batch_indexes`` and, from a weighting sampler, ``weights``."""
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        if len(self.storage) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if self.storage.num_live == 0:
            raise ValueError("cannot sample: every row refers to overwritten frames")
        slots, weights = self.sampler.sample(num_items, self.storage, self._rng)
        self._num_sampled += len(slots)
        np.add.at(self._hit_count, slots, 1)
        skip = () if weights is None else (SampleBatch.WEIGHTS,)
        columns = self.storage.take(slots, skip)
        columns[SampleBatch.BATCH_INDEXES] = slots
        out = self.storage.to_batch(columns)
        if weights is not None:
            out[SampleBatch.WEIGHTS] = weights
        return out

    def rows_at(self, slots: np.ndarray) -> SampleBatch:
        """The stored rows at ``slots`` (each in ``[0, len(self))``), not counted as sampled."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        held = len(self.storage)
        if len(slots) and (slots.min() < 0 or slots.max() >= held):
            raise IndexError(f"slots must be in [0, {held}), got {slots.min()}..{slots.max()}")
        return self.storage.to_batch(self.storage.take(slots))

    def is_retired(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether its row is retired (held, never sampled again)."""
        return self.storage.is_retired(slots)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priority of the rows at slots ``indices``; the last of duplicates wins.

        Priorities must be finite and > 0 (ValueError otherwise); indices must be slots
        holding rows, ``0 <= i < len(self)`` (IndexError otherwise). Validation happens
        before any change. Indices come from a sample's ``batch_indexes``; a slot
        overwritten since then gets the priority meant for the row it held (as in RLlib);
        a retired one keeps none. A sampler without priorities ignores them.
        """
        slots = np.asarray(indices)
        values = np.asarray(priorities, dtype=np.float64)
        if slots.ndim != 1 or slots.shape != values.shape:
            raise ValueError(f"indices and priorities must be 1-D of equal length, "
                             f"got shapes {slots.shape} and {values.shape}")
        if len(slots) == 0:
            return
        if slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {slots.dtype}")
        held = len(self.storage)
        low, high = int(slots.min()), int(slots.max())
        if low < 0 or high >= held:
            bad = low if low < 0 else high
            raise IndexError(f"slot {bad} out of range: the buffer holds {held} rows")
        if self.storage.num_live < held:
            live = ~self.storage.is_retired(slots)
            slots, values = slots[live], values[live]
            if len(slots) == 0:
                return
        if not (values.min() > 0 and math.isfinite(values.max())):
            position = int(np.flatnonzero(~(np.isfinite(values) & (values > 0)))[0])
            raise ValueError(f"priorities must be finite and > 0, got {values[position]} "
                             f"at position {position}")
        self.sampler.update_priorities(slots.astype(np.intp, copy=False), values)

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """Counters as RLlib reports them, the storage's and the sampler's figures;
        ``debug`` adds how often evicted rows were sampled (and the sampler's extras).

        ``added_count``/``sampled_count``: rows added/sampled since construction.
        ``num_entries``: rows held. ``est_size_bytes``: bytes of the rows held;
        ``allocated_bytes``: bytes of the preallocated columns.
        """
        out: dict[str, Any] = {"added_count": self._num_added,
                               "sampled_count": self._num_sampled, **self.storage.stats()}
        if debug:
            out.update(self._evicted_hit_stats.stats())
        out.update(self.sampler.stats(debug))
        return out

    def _count_write(self, written: Written) -> None:
        """Record the sample counts of the rows overwritten (oldest first; rows of the
        batch itself overwritten count as never sampled) and reset the new rows'."""
        if len(written.evicted):
            self._evicted_hit_stats.push_many(self._hit_count.take(written.evicted))
        if written.skipped:
            self._evicted_hit_stats.push_many(np.zeros(written.skipped))
        for start, stop, _ in written.segments:
            self._hit_count[start:stop] = 0
        self._num_added += written.count + written.skipped
