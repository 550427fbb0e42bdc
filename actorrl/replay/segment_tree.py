"""Sum and min segment trees over a power-of-two number of leaves, vectorized with numpy.

Layout: one flat float64 array of ``2 * capacity`` nodes; the root is node 1, node ``i`` has
children ``2i`` and ``2i + 1``, and leaf ``j`` is node ``capacity + j`` (node 0 is unused).
Every internal node holds ``op(left child, right child)``, recomputed from its children so
the sum tree never accumulates rounding drift.

Writes are batched and propagation is deferred: ``update`` and ``update_range`` set the
leaves at once and remember which ones changed; the first query that reads an internal node
(``total``/``sum``/``min``/``find_prefixsum_idx``) recomputes their ancestors level by level,
one numpy step per level for all changed leaves together, or rebuilds the whole tree when
that is cheaper. Many small writes between queries (a replay shard taking rollouts) thus
cost one propagation. Reading leaves (``get``) needs no propagation.
"""

from __future__ import annotations

import numpy as np


class SegmentTree:
    """A complete binary tree whose internal nodes hold ``operation`` of their children.

    ``operation`` is a binary ufunc that is associative and commutative (``np.add``,
    ``np.minimum``) and ``neutral`` its identity; unset leaves hold ``neutral``.
    Not thread-safe.
    """

    # Propagation cost model, in units of one node recomputed by a contiguous op. Per level,
    # recomputing the whole level (width w) costs about CALL_COST + w; recomputing only the
    # ancestors of n written leaves costs SPARSE_CALLS * CALL_COST + SPARSE_NODE_COST * n.
    # Measured with numpy 2 on the 2-core dev machine.
    CALL_COST = 1250
    SPARSE_CALLS = 4
    SPARSE_NODE_COST = 7

    def __init__(self, capacity: int, operation: np.ufunc, neutral: float) -> None:
        if capacity < 1 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a positive power of two, got {capacity}")
        self._capacity = capacity
        self._depth = capacity.bit_length() - 1
        self._op = operation
        self._neutral = float(neutral)
        self._tree = np.full(2 * capacity, self._neutral, dtype=np.float64)
        self._pairs = self._tree.reshape(-1, 2)  # row n holds nodes 2n and 2n + 1
        self._leaves = self._tree[capacity:]
        self._dirty: list[np.ndarray | range] = []  # leaves written since the last propagation
        self._dirty_count = 0

    @property
    def capacity(self) -> int:
        """Number of leaves."""
        return self._capacity

    @property
    def depth(self) -> int:
        """Levels between the root and the leaves (``log2(capacity)``)."""
        return self._depth

    @property
    def neutral(self) -> float:
        """Identity of the operation; the value of unset leaves."""
        return self._neutral

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (a new float64 array of the same shape)."""
        return self._leaves.take(indices)

    def leaves(self) -> np.ndarray:
        """All leaf values (a read-only view)."""
        view = self._leaves.view()
        view.flags.writeable = False
        return view

    def update(self, indices: np.ndarray, values: np.ndarray, *, unique: bool = False) -> None:
        """Set leaves ``indices`` to ``values``; with duplicate indices the last write wins.

        ``values`` broadcasts against ``indices``. Raises IndexError for an index outside
        ``[0, capacity)``. ``unique=True`` promises the indices hold no duplicates and skips
        the duplicate handling (a sort).
        """
        indices = np.asarray(indices, dtype=np.intp).reshape(-1)
        values = np.asarray(values, dtype=np.float64)
        if values.shape != indices.shape:
            values = np.broadcast_to(values, indices.shape)
        if len(indices) == 0:
            return
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= self._capacity:
            bad = low if low < 0 else high
            raise IndexError(f"leaf index {bad} out of range [0, {self._capacity})")
        if not unique and len(indices) > 1:
            indices, values = last_writes(indices, values)
        self._leaves[indices] = values
        # A copy: the caller may reuse its array before the deferred propagation reads it.
        self._mark_dirty(indices.copy())

    def update_range(self, start: int, values: np.ndarray) -> None:
        """Set the contiguous leaves ``start .. start + len(values) - 1`` to ``values``."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        self._set_range(start, start + len(values), values)

    def fill_range(self, start: int, stop: int, value: float) -> None:
        """Set the contiguous leaves ``start .. stop - 1`` all to ``value``."""
        self._set_range(start, stop, value)

    def total(self) -> float:
        """``operation`` over all leaves (the root)."""
        self._propagate()
        return float(self._tree[1])

    def nodes(self) -> np.ndarray:
        """The whole flat node array after propagation (a read-only view; for tests)."""
        self._propagate()
        view = self._tree.view()
        view.flags.writeable = False
        return view

    def _set_range(self, start: int, stop: int, values: np.ndarray | float) -> None:
        if start < 0 or stop > self._capacity or start > stop:
            raise IndexError(f"leaf range [{start}, {stop}) out of range [0, {self._capacity})")
        if start == stop:
            return
        self._leaves[start:stop] = values
        self._mark_dirty(range(start, stop))

    def _mark_dirty(self, leaf_indices: np.ndarray | range) -> None:
        self._dirty.append(leaf_indices)
        self._dirty_count += len(leaf_indices)

    def _propagate(self) -> None:
        """Recompute the ancestors of every leaf written since the last propagation.

        Levels run bottom-up, one numpy step each. A wide level recomputes just the
        ancestors of the written leaves (a gather, the op and a scatter); once a level is
        narrow enough that recomputing all of it in one contiguous op is cheaper, it and
        every level above are recomputed whole. Many writes make that a full rebuild.
        """
        if not self._dirty:
            return
        tree, pairs, op = self._tree, self._pairs, self._op
        sparse_extra_calls = (self.SPARSE_CALLS - 1) * self.CALL_COST
        whole_level_below = sparse_extra_calls + self.SPARSE_NODE_COST * self._dirty_count
        width = self._capacity // 2  # number of nodes on the level being recomputed
        if width > whole_level_below:
            nodes = np.concatenate(
                [np.arange(d.start, d.stop) if isinstance(d, range) else d for d in self._dirty]
            )
            nodes += self._capacity
        self._dirty.clear()
        self._dirty_count = 0
        while width > whole_level_below:
            # Repeated nodes get the same value from the same children: no de-duplication.
            nodes >>= 1
            children = pairs.take(nodes, axis=0)
            tree[nodes] = op(children[:, 0], children[:, 1])
            width //= 2
        while width >= 1:
            op(
                pairs[width : 2 * width, 0],
                pairs[width : 2 * width, 1],
                out=tree[width : 2 * width],
            )
            width //= 2


class SumSegmentTree(SegmentTree):
    """Segment tree of sums; leaves must be >= 0 for ``find_prefixsum_idx`` to be meaningful."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def sum(self) -> float:
        """Sum of all leaves."""
        return self.total()

    def find_prefixsum_idx(self, prefixsums: np.ndarray) -> np.ndarray:
        """For each ``s``, the smallest leaf ``i`` with ``leaf[0] + ... + leaf[i] > s``.

        All queries descend together, one numpy step per level. ``s`` must be >= 0
        (ValueError otherwise). A query never lands on a zero leaf while the sum is
        positive: for ``s >= sum()``, or where rounding overshoots a subtree, it returns the
        last positive leaf on its path. Returns an intp array shaped like ``prefixsums``.
        """
        self._propagate()
        remaining = np.array(prefixsums, dtype=np.float64)
        shape = remaining.shape
        remaining = remaining.reshape(-1)
        if len(remaining) == 0:
            return np.zeros(shape, dtype=np.intp)
        if not remaining.min() >= 0.0:
            raise ValueError(f"prefix sums must be >= 0 and not NaN, got {remaining.min()}")
        leaf_indices = self._descend(remaining.copy(), guard_zero=False)
        # Exact arithmetic never ends on a zero leaf; rounding (or s >= sum) rarely can.
        landed_on_zero = self._leaves.take(leaf_indices) <= 0.0
        if landed_on_zero.any() and self._tree[1] > 0.0:
            leaf_indices[landed_on_zero] = self._descend(remaining[landed_on_zero], guard_zero=True)
        return leaf_indices.reshape(shape)

    def _descend(self, remaining: np.ndarray, guard_zero: bool) -> np.ndarray:
        """Leaf reached by each prefix sum; ``remaining`` is consumed in place.

        With ``guard_zero`` a query only turns right into a subtree of positive sum.
        """
        tree = self._tree
        nodes = np.ones(len(remaining), dtype=np.intp)
        left_sum = np.empty(len(remaining), dtype=np.float64)
        go_right = np.empty(len(remaining), dtype=bool)
        for _ in range(self._depth):
            nodes <<= 1  # left children
            tree.take(nodes, out=left_sum)
            np.greater_equal(remaining, left_sum, out=go_right)
            if guard_zero:
                go_right &= tree.take(nodes + 1) > 0.0
            left_sum *= go_right
            remaining -= left_sum
            nodes += go_right
        nodes -= self._capacity
        return nodes


class MinSegmentTree(SegmentTree):
    """Segment tree of minima; unset leaves hold +inf."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, np.inf)

    def min(self) -> float:
        """Minimum over all leaves (+inf when none is set)."""
        return self.total()


def last_writes(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last occurrence of each index: what sequential writes would leave.

    Returns ``(indices, values)`` without repeats: the inputs themselves when there are
    none, else sorted by index. Sorted input (as a stratified sample's slots are) takes a
    fast path with no sort.
    """
    if len(indices) < 2:
        return indices, values
    steps = np.diff(indices)
    smallest_step = steps.min()
    if smallest_step > 0:
        return indices, values
    if smallest_step == 0:
        # Sorted with repeats: keep the last of each run of equal indices.
        keep = np.empty(len(indices), dtype=bool)
        keep[-1] = True
        np.not_equal(steps, 0, out=keep[:-1])
        return indices[keep], values[keep]
    # np.unique keeps each value's first occurrence; search the reversed order for the last.
    unique, first_in_reversed = np.unique(indices[::-1], return_index=True)
    if len(unique) == len(indices):
        return indices, values
    return unique, values[::-1][first_in_reversed]


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()
