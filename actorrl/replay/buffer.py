"""Replay buffers with columnar numpy storage: uniform and proportional prioritized.

Storage is one preallocated array per column (``capacity`` rows), allocated on the first
``add_batch`` from that batch's dtypes and row shapes. A batch is written with at most two
slice copies per column (two when it wraps past the end); sampling is one gather per column.
Nothing here loops over rows in Python.

``PrioritizedReplayBuffer`` follows Schaul et al. (2016), proportional variant, as in
RLlib: row ``i`` is sampled with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` and
weighted by ``(N * P(i))^-beta / max_j (N * P(j))^-beta``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from actorrl.batch import SampleBatch
from actorrl.metrics import WindowStat
from actorrl.replay.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    last_writes,
    next_power_of_two,
)

EVICTED_HIT_WINDOW = 1000
"""How many evicted rows' sample counts ``stats(debug=True)`` summarises."""
REPRIORITIZATION_WINDOW = 1000
"""How many priority changes ``stats(debug=True)`` summarises."""


class ReplayBuffer:
    """Fixed-capacity FIFO replay buffer with uniform sampling (with replacement).

    Rows of every added ``SampleBatch`` are stored in columnar arrays; once full, each new
    row overwrites the oldest. ``sample`` returns the stored columns plus ``batch_indexes``
    (the storage slot of each row, int64). Every batch added must have the columns, dtypes
    (up to a same-kind cast) and row shapes of the first one. Not thread-safe.
    """

    def __init__(self, capacity: int, *, seed: int | np.random.Generator | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        self._rng = np.random.default_rng(seed)
        self._storage: dict[str, np.ndarray] = {}
        self._next_slot = 0
        self._size = 0
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
        return self._size

    @property
    def columns(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Stored columns: name -> (dtype, row shape); empty before the first add."""
        return {name: (arr.dtype, arr.shape[1:]) for name, arr in self._storage.items()}

    def add_batch(self, batch: SampleBatch) -> None:
        """Append all rows of ``batch``, overwriting the oldest rows once full."""
        self._write(batch)

    def sample(self, num_items: int) -> SampleBatch:
        """``num_items`` rows drawn uniformly with replacement, plus ``batch_indexes``."""
        self._check_can_sample(num_items)
        # Scaling a uniform float is ~5x cheaper than Generator.integers for small draws;
        # the bias is below 2**-53 * len(self).
        slots = (self._rng.random(num_items) * self._size).astype(np.int64)
        np.minimum(slots, self._size - 1, out=slots)
        return self._gather(slots)

    def rows_at(self, slots: np.ndarray) -> SampleBatch:
        """The stored rows at ``slots`` (each in ``[0, len(self))``), not counted as sampled."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if len(slots) and (slots.min() < 0 or slots.max() >= self._size):
            raise IndexError(
                f"slots must be in [0, {self._size}), got {slots.min()}..{slots.max()}"
            )
        return SampleBatch(
            {name: column.take(slots, axis=0) for name, column in self._storage.items()}
        )

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """Counters as RLlib reports them; ``debug`` adds how often evicted rows were sampled.

        ``added_count``/``sampled_count``: rows added/sampled since construction.
        ``num_entries``: rows held. ``est_size_bytes``: bytes of the rows held;
        ``allocated_bytes``: bytes of the preallocated columns.
        """
        out: dict[str, Any] = {
            "added_count": self._num_added,
            "sampled_count": self._num_sampled,
            "est_size_bytes": self._size * self._row_nbytes(),
            "allocated_bytes": sum(arr.nbytes for arr in self._storage.values()),
            "num_entries": self._size,
        }
        if debug:
            out.update(self._evicted_hit_stats.stats())
        return out

    # -- internals shared with PrioritizedReplayBuffer ------------------------------------

    def _write(self, batch: SampleBatch) -> tuple[int, int]:
        """Store ``batch``'s rows; returns ``(first_slot, rows_written)``.

        The rows written occupy slots ``first_slot, first_slot + 1, ...`` modulo capacity.
        When the batch holds more rows than the capacity only its last ``capacity`` rows
        are written: sequential adds would have overwritten the others.
        """
        count = batch.count
        if count == 0:
            return self._next_slot, 0
        if not self._storage:
            self._allocate(batch)
        else:
            self._check_columns(batch)
        capacity = self._capacity
        written = min(count, capacity)
        skipped = count - written
        self._record_evictions(count, skipped)
        first_slot = (self._next_slot + skipped) % capacity
        segments = _wrapped_segments(first_slot, written, capacity)
        storage = self._storage
        # dict.items: SampleBatch.__getitem__ is a Python-level override, slow per call.
        for name, values in dict.items(batch):
            column = storage[name]
            for start, stop, offset in segments:
                column[start:stop] = values[skipped + offset : skipped + offset + stop - start]
        for start, stop, _ in segments:
            self._hit_count[start:stop] = 0
        self._next_slot = (self._next_slot + count) % capacity
        self._size = min(self._size + count, capacity)
        self._num_added += count
        return first_slot, written

    def _record_evictions(self, count: int, skipped: int) -> None:
        """Push the sample counts of the rows about to be overwritten, oldest first."""
        evicted = self._size + count - self._capacity
        if evicted <= 0:
            return
        evicted_old = min(self._size, evicted)
        # Before the buffer is full it fills from slot 0, so the first eviction hits slot 0.
        first = self._next_slot if self._size == self._capacity else 0
        hits = self._hit_count.take(np.arange(first, first + evicted_old), mode="wrap")
        self._evicted_hit_stats.push_many(hits)
        if skipped:
            self._evicted_hit_stats.push_many(np.zeros(skipped))

    def _allocate(self, batch: SampleBatch) -> None:
        """Create one ``capacity``-row array per column of ``batch`` (all or none)."""
        storage = {}
        for name, values in dict.items(batch):
            if values.ndim == 0:
                raise ValueError(
                    f"column {name!r} is a scalar; every column needs one row per step"
                )
            storage[name] = np.empty((self._capacity, *values.shape[1:]), values.dtype)
        self._storage = storage

    def _check_columns(self, batch: SampleBatch) -> None:
        """Raise ValueError unless ``batch`` has the stored columns, row shapes and dtypes."""
        storage = self._storage
        if len(batch) != len(storage) or not all(name in storage for name in batch):
            missing = sorted(storage.keys() - batch.keys())
            extra = sorted(batch.keys() - storage.keys())
            raise ValueError(
                f"batch columns differ from the buffer's: missing {missing}, unexpected {extra}"
            )
        for name, values in dict.items(batch):
            column = storage[name]
            if values.dtype is column.dtype and values.shape[1:] == column.shape[1:]:
                continue
            if values.shape[1:] != column.shape[1:]:
                raise ValueError(
                    f"column {name!r} rows have shape {values.shape[1:]}, "
                    f"the buffer stores {column.shape[1:]}"
                )
            if values.dtype != column.dtype and not np.can_cast(
                values.dtype, column.dtype, casting="same_kind"
            ):
                raise ValueError(
                    f"column {name!r} has dtype {values.dtype}, "
                    f"which does not cast safely to the stored {column.dtype}"
                )

    def _check_can_sample(self, num_items: int) -> None:
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        if self._size == 0:
            raise ValueError(f"cannot sample from an empty {type(self).__name__}")

    def _gather(self, slots: np.ndarray, skip: tuple[str, ...] = ()) -> SampleBatch:
        """Rows at ``slots`` as a SampleBatch with ``batch_indexes``; counts the hits."""
        self._num_sampled += len(slots)
        np.add.at(self._hit_count, slots, 1)
        columns = {
            name: column.take(slots, axis=0)
            for name, column in self._storage.items()
            if name not in skip
        }
        columns[SampleBatch.BATCH_INDEXES] = slots
        return SampleBatch(columns)

    def _row_nbytes(self) -> int:
        return sum(arr.itemsize * math.prod(arr.shape[1:]) for arr in self._storage.values())


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016), as RLlib's.

    New rows get priority ``max_priority`` (the largest ever set, initially 1); a row's
    sampling mass is ``priority ** alpha``. ``sample(n, beta)`` draws one row per
    equal-mass stratum of the total and adds ``weights``, the importance weights
    ``(N * P(i)) ** -beta / (N * P_min) ** -beta`` (float32, max 1), and ``batch_indexes``.
    An overwritten slot takes the new row's priority. ``eps`` is added to ``|td_error|``
    by ``update_priorities_from_td_errors``.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float,
        eps: float = 1e-6,
        *,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {float(alpha)}")
        if not (isinstance(eps, numbers.Real) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        super().__init__(capacity, seed=seed)
        self._alpha = float(alpha)
        self._eps = float(eps)
        tree_capacity = next_power_of_two(self._capacity)
        self._sum_tree = SumSegmentTree(tree_capacity)
        self._min_tree = MinSegmentTree(tree_capacity)
        self._max_priority = 1.0
        self._reprio_stats = WindowStat("reprio", REPRIORITIZATION_WINDOW)
        self._strata = np.zeros(0)

    @property
    def alpha(self) -> float:
        """Prioritization exponent: 0 is uniform, 1 fully proportional."""
        return self._alpha

    @property
    def eps(self) -> float:
        """Added to ``|td_error|`` to keep priorities positive."""
        return self._eps

    @property
    def max_priority(self) -> float:
        """Largest priority ever set (before ``** alpha``); new rows get it."""
        return self._max_priority

    def priority_mass(self, slots: np.ndarray) -> np.ndarray:
        """Sampling mass ``priority ** alpha`` of the rows at ``slots``."""
        return self._sum_tree.get(np.asarray(slots, dtype=np.intp))

    def add_batch(self, batch: SampleBatch, priorities: np.ndarray | None = None) -> None:
        """Append all rows of ``batch`` with priority ``max_priority``, or with the given
        per-row ``priorities`` (Ape-X's worker-side initial priorities)."""
        first_slot, written = self._write(batch)
        if priorities is not None:
            priorities = np.asarray(priorities, dtype=np.float64)[batch.count - written:]
            slots = (first_slot + np.arange(written)) % self._capacity
            self.update_priorities(slots, priorities)
            return
        mass = self._max_priority**self._alpha
        for start, stop, _ in _wrapped_segments(first_slot, written, self._capacity):
            self._sum_tree.fill_range(start, stop, mass)
            self._min_tree.fill_range(start, stop, mass)

    def sample(self, num_items: int, beta: float = 0.4) -> SampleBatch:  # type: ignore[override]
        """``num_items`` rows by stratified proportional sampling, with ``weights``.

        The total mass is cut into ``num_items`` equal strata and one uniform point is drawn
        in each, so every row is drawn with probability proportional to its mass, and the
        batch covers the distribution more evenly than independent draws.
        """
        if not beta >= 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._check_can_sample(num_items)
        total_mass = self._sum_tree.sum()
        if len(self._strata) != num_items:
            self._strata = np.arange(num_items, dtype=np.float64)
        points = self._strata + self._rng.random(num_items)
        points *= total_mass / max(num_items, 1)
        slots = self._sum_tree.find_prefixsum_idx(points).astype(np.int64, copy=False)
        # (N P(i))^-beta / (N P_min)^-beta == (mass_min / mass_i)^beta; N and the total cancel.
        weights = np.power(self._min_tree.min() / self._sum_tree.get(slots), beta)
        out = self._gather(slots, skip=(SampleBatch.WEIGHTS,))
        out[SampleBatch.WEIGHTS] = weights.astype(np.float32)
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priority of the rows at slots ``indices``; the last of duplicates wins.

        Priorities must be finite and > 0 (ValueError otherwise); indices must be slots
        holding rows, ``0 <= i < len(self)`` (IndexError otherwise). Validation happens
        before any change. Indices come from a sample's ``batch_indexes``; a slot
        overwritten since then gets the priority meant for the row it held (as in RLlib).
        """
        slots = np.asarray(indices)
        values = np.asarray(priorities, dtype=np.float64)
        if slots.ndim != 1 or slots.shape != values.shape:
            raise ValueError(
                f"indices and priorities must be 1-D of equal length, "
                f"got shapes {slots.shape} and {values.shape}"
            )
        if len(slots) == 0:
            return
        if slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {slots.dtype}")
        low, high = int(slots.min()), int(slots.max())
        if low < 0 or high >= self._size:
            bad = low if low < 0 else high
            raise IndexError(f"slot {bad} out of range: the buffer holds {self._size} rows")
        smallest, largest = values.min(), values.max()
        if not (smallest > 0 and math.isfinite(largest)):
            position = int(np.flatnonzero(~(np.isfinite(values) & (values > 0)))[0])
            raise ValueError(
                f"priorities must be finite and > 0, got {values[position]} at position {position}"
            )
        slots, values = last_writes(slots.astype(np.intp, copy=False), values)
        mass = values if self._alpha == 1.0 else np.power(values, self._alpha)
        self._reprio_stats.push_many(mass - self._sum_tree.get(slots))
        self._sum_tree.update(slots, mass, unique=True)
        self._min_tree.update(slots, mass, unique=True)
        self._max_priority = max(self._max_priority, float(largest))

    def update_priorities_from_td_errors(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set priorities to ``|td_error| + eps`` (the Ape-X replay shard's rule)."""
        self.update_priorities(indices, np.abs(np.asarray(td_errors, dtype=np.float64)) + self._eps)

    def stats(self, debug: bool = False) -> dict[str, Any]:
        """``ReplayBuffer.stats`` plus priority stats; ``debug`` adds priority-change stats.

        ``max_priority``: largest priority set. ``priority_mass_total`` and
        ``priority_mass_min``: sum and minimum of ``priority ** alpha`` over the rows held
        (0.0 when empty).
        """
        out = super().stats(debug)
        empty = self._size == 0
        out["max_priority"] = self._max_priority
        out["priority_mass_total"] = 0.0 if empty else self._sum_tree.sum()
        out["priority_mass_min"] = 0.0 if empty else self._min_tree.min()
        if debug:
            out.update(self._reprio_stats.stats())
        return out


def _wrapped_segments(first_slot: int, count: int, capacity: int) -> list[tuple[int, int, int]]:
    """Slots ``first_slot .. first_slot + count - 1`` modulo capacity, as contiguous pieces.

    Returns ``(start, stop, offset)`` triples, ``offset`` being the first row's position
    among the ``count`` rows; at most two pieces.
    """
    if count == 0:
        return []
    head = min(count, capacity - first_slot)
    segments = [(first_slot, first_slot + head, 0)]
    if count > head:
        segments.append((0, count - head, head))
    return segments
