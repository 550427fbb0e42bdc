"""Replay: vectorized segment trees against a slow per-item reference, and the buffers.

Chi-square thresholds are the 0.999 quantiles of the chi-square distribution (false-alarm
probability 0.001 for a correct sampler), hard-coded from ``scipy.stats.chi2.ppf(0.999,
dof)``: dof 7 -> 24.322, dof 15 -> 37.697. The samplers run with fixed seeds, so each test is
deterministic; the thresholds say how far from the expected counts a draw may land.
Stratified sampling spreads draws more evenly than independent draws, which only lowers the
statistic, so the thresholds stay valid (conservative) for it.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorrl.data.batch import SampleBatch
from actorrl.replay import (
    MinSegmentTree,
    PrioritizedSampler,
    ReplayBuffer,
    SumSegmentTree,
)
from actorrl.replay.segment_tree import last_writes, next_power_of_two

CHI2_999 = {7: 24.322, 15: 37.697}


# -- slow references ----------------------------------------------------------------------


class SlowSegmentTree:
    """Per-item reference: a Python list, one leaf and its ancestors per write."""

    def __init__(self, capacity: int, op: Callable[[float, float], float], neutral: float):
        self.capacity = capacity
        self.op = op
        self.nodes = [neutral] * (2 * capacity)

    def set(self, leaf: int, value: float) -> None:
        node = leaf + self.capacity
        self.nodes[node] = float(value)
        node //= 2
        while node >= 1:
            self.nodes[node] = self.op(self.nodes[2 * node], self.nodes[2 * node + 1])
            node //= 2

    def leaves(self) -> list[float]:
        return self.nodes[self.capacity :]

    def find_prefixsum_idx(self, prefixsum: float) -> int:
        """Smallest i with leaf[0] + ... + leaf[i] > s; else the last positive leaf."""
        running = 0.0
        last_positive = 0
        for i, value in enumerate(self.leaves()):
            if value > 0:
                last_positive = i
            running += value
            if running > prefixsum and value > 0:
                return i
        return last_positive


def cartpole_batch(rows: int, start: int = 0) -> SampleBatch:
    """CartPole-shaped rows whose contents encode their global row number ``start + k``."""
    ids = np.arange(start, start + rows)
    return SampleBatch(
        obs=np.stack([ids, ids + 0.5, -ids, ids * 2.0], axis=1).astype(np.float32),
        new_obs=np.stack([ids + 1, ids, ids, ids], axis=1).astype(np.float32),
        actions=(ids % 2).astype(np.int64),
        rewards=ids.astype(np.float32),
        terminateds=ids % 7 == 0,
        truncateds=np.zeros(rows, dtype=bool),
        eps_id=ids.astype(np.int64),
    )


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's statistic sum((O - E)^2 / E)."""
    return float(np.sum((observed - expected) ** 2 / expected))


# -- segment trees ------------------------------------------------------------------------

leaf_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("update"),
            st.lists(st.tuples(st.integers(0, 15), st.integers(0, 100)), min_size=1, max_size=24),
        ),
        st.tuples(st.just("range"), st.integers(0, 15), st.lists(st.integers(0, 100), max_size=8)),
        st.tuples(st.just("fill"), st.integers(0, 15), st.integers(0, 8), st.integers(0, 100)),
    ),
    min_size=1,
    max_size=12,
)


def apply_op(fast: object, slow: SlowSegmentTree, op: tuple) -> None:
    """Apply one generated write to the fast tree and, item by item, to the reference."""
    capacity = slow.capacity
    if op[0] == "update":
        pairs = op[1]
        fast.update(np.array([i for i, _ in pairs]), np.array([v for _, v in pairs], float))
        for i, v in pairs:
            slow.set(i, v)
    elif op[0] == "range":
        start, values = op[1], op[2][: capacity - op[1]]
        fast.update_range(start, np.array(values, dtype=float))
        for k, v in enumerate(values):
            slow.set(start + k, v)
    else:
        start, length, value = op[1], op[2], op[3]
        stop = min(capacity, start + length)
        fast.fill_range(start, stop, value)
        for i in range(start, stop):
            slow.set(i, value)


class SparseSumTree(SumSegmentTree):
    """Cost model rigged so propagation recomputes only ancestors, on every level."""

    CALL_COST = 0
    SPARSE_NODE_COST = 0


class SparseMinTree(MinSegmentTree):
    """Cost model rigged so propagation recomputes only ancestors, on every level."""

    CALL_COST = 0
    SPARSE_NODE_COST = 0


class RebuildSumTree(SumSegmentTree):
    """Cost model rigged so propagation always recomputes whole levels."""

    CALL_COST = 10**9


class RebuildMinTree(MinSegmentTree):
    """Cost model rigged so propagation always recomputes whole levels."""

    CALL_COST = 10**9


# The unrigged classes mix both strategies; on 16 leaves they always rebuild, and the large
# test below covers their mixed path.
SUM_TREES = [SparseSumTree, RebuildSumTree]
MIN_TREES = [SparseMinTree, RebuildMinTree]
queries_strategy = st.lists(
    st.one_of(st.floats(0, 2000, allow_nan=False), st.integers(0, 1700).map(float)), max_size=24
)


@pytest.mark.parametrize("tree_class", SUM_TREES)
@settings(max_examples=30, deadline=None)
@given(ops=leaf_ops, queries=queries_strategy)
def test_sum_tree_matches_per_item_reference(
    tree_class: type[SumSegmentTree], ops: list, queries: list[float]
) -> None:
    """After any writes (duplicates included), every node of the vectorized sum tree equals
    the per-item reference bit for bit, whichever way propagation runs, and prefix-sum
    search finds the reference's leaf for every query, including queries exactly on a
    boundary (integer leaves keep all sums exact)."""
    fast, slow = tree_class(16), SlowSegmentTree(16, operator.add, 0.0)
    for op in ops:
        apply_op(fast, slow, op)
        np.testing.assert_array_equal(fast.nodes()[1:], np.array(slow.nodes[1:]))
    assert fast.sum() == slow.nodes[1]
    if fast.sum() > 0:
        found = fast.find_prefixsum_idx(np.array(queries))
        assert found.tolist() == [slow.find_prefixsum_idx(q) for q in queries]
    np.testing.assert_array_equal(fast.get(np.arange(16)), slow.leaves())


@pytest.mark.parametrize("tree_class", MIN_TREES)
@settings(max_examples=30, deadline=None)
@given(ops=leaf_ops)
def test_min_tree_matches_per_item_reference(tree_class: type[MinSegmentTree], ops: list) -> None:
    """Every node of the vectorized min tree equals the per-item reference after any writes,
    whichever way propagation runs, and ``min()`` is the minimum over the leaves set so far
    (+inf before any)."""
    fast, slow = tree_class(16), SlowSegmentTree(16, min, math.inf)
    assert fast.min() == math.inf
    for op in ops:
        apply_op(fast, slow, op)
        np.testing.assert_array_equal(fast.nodes()[1:], np.array(slow.nodes[1:]))
        assert fast.min() == min(slow.leaves())


def test_prefix_search_on_exact_boundaries() -> None:
    """A query equal to a prefix sum moves past that leaf: with unit leaves, s = k finds k."""
    tree = SumSegmentTree(8)
    tree.update(np.arange(8), np.ones(8))
    assert tree.find_prefixsum_idx(np.arange(8.0)).tolist() == list(range(8))
    assert tree.find_prefixsum_idx(np.arange(8.0) + 0.5).tolist() == list(range(8))


def test_duplicate_indices_last_write_wins() -> None:
    """Within one update call, a leaf written several times keeps the last value."""
    tree = SumSegmentTree(8)
    tree.update(np.array([3, 5, 3, 3, 5]), np.array([1.0, 2.0, 7.0, 4.0, 9.0]))
    assert tree.get(np.array([3, 5])).tolist() == [4.0, 9.0]
    assert tree.sum() == 13.0


@settings(max_examples=80, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 9), st.integers(-5, 5)), max_size=20),
    ordered=st.booleans(),
)
def test_last_writes_matches_sequential_writes(pairs: list[tuple[int, int]], ordered: bool) -> None:
    """last_writes keeps exactly the value each index would hold after writing the pairs in
    order, for sorted input (the fast path) and unsorted input alike."""
    if ordered:
        pairs = sorted(pairs, key=lambda pair: pair[0])  # stable: keeps write order per index
    expected: dict[int, int] = {}
    for index, value in pairs:
        expected[index] = value
    indices, values = last_writes(
        np.array([i for i, _ in pairs], dtype=np.intp), np.array([v for _, v in pairs], float)
    )
    assert len(indices) == len(expected)
    assert dict(zip(indices.tolist(), values.tolist())) == expected


def test_caller_reusing_its_index_array_does_not_corrupt_the_tree() -> None:
    """Propagation is deferred, so the tree must not keep the caller's index array: writing
    into it after ``update`` leaves the sums right."""
    tree = SumSegmentTree(1 << 15)  # wide enough that propagation reads the written indices
    indices = np.array([3, 40000 % (1 << 15), 7])
    tree.update(indices, np.array([1.0, 2.0, 4.0]))
    indices[:] = 0
    assert tree.sum() == 7.0
    assert tree.nodes()[1] == 7.0 and tree.find_prefixsum_idx(np.array([4.5])).tolist() == [7]


def test_large_random_trees_match_reference() -> None:
    """With float leaves over 2**15 slots and batches from 3 leaves (sparse propagation on
    the wide levels) to 12000 (full rebuild), sums and minima match the per-item reference
    bit for bit, and each query s lands on a leaf i with prefix(i-1) <= s < prefix(i) up to
    rounding."""
    rng = np.random.default_rng(7)
    capacity = 1 << 15
    fast_sum, fast_min = SumSegmentTree(capacity), MinSegmentTree(capacity)
    slow_sum = SlowSegmentTree(capacity, operator.add, 0.0)
    slow_min = SlowSegmentTree(capacity, min, math.inf)
    for batch_size in (3, 600, 12000, 17, 1):
        idx = rng.integers(0, capacity - 100, batch_size)  # the last 100 leaves stay empty
        values = rng.random(batch_size) + 1e-3
        for tree in (fast_sum, fast_min):
            tree.update(idx, values)
        for i, v in zip(idx.tolist(), values.tolist()):
            slow_sum.set(i, v)
            slow_min.set(i, v)
        np.testing.assert_array_equal(fast_sum.nodes()[1:], slow_sum.nodes[1:])
        np.testing.assert_array_equal(fast_min.nodes()[1:], slow_min.nodes[1:])
    total = fast_sum.sum()
    queries = np.concatenate([rng.random(1000) * total, [0.0, total, total * 1.5]])
    found = fast_sum.find_prefixsum_idx(queries)
    cumulative = np.cumsum(slow_sum.leaves())
    leaves = np.array(slow_sum.leaves())
    assert (leaves[found] > 0).all(), "a query landed on an empty leaf"
    inner = queries < total
    upper = cumulative[found[inner]]
    lower = upper - leaves[found[inner]]
    assert (lower <= queries[inner] + 1e-9 * total).all()
    assert (queries[inner] < upper + 1e-9 * total).all()
    last_positive = int(np.flatnonzero(leaves > 0)[-1])
    assert found[-2:].tolist() == [last_positive, last_positive]


def test_prefix_search_never_returns_empty_leaf_at_the_end() -> None:
    """Queries at or beyond the total return the last positive leaf, never the empty tail."""
    tree = SumSegmentTree(8)
    tree.update(np.arange(5), np.array([0.1, 0.2, 0.3, 0.0, 0.4]))
    found = tree.find_prefixsum_idx(np.array([tree.sum(), tree.sum() + 1.0, 0.0, 0.65]))
    assert found.tolist() == [4, 4, 0, 4]


def test_tree_rejects_bad_arguments() -> None:
    """Capacity must be a power of two; indices out of range and negative or NaN prefix sums
    are errors, not silent writes or garbage indices."""
    with pytest.raises(ValueError, match="power of two"):
        SumSegmentTree(12)
    tree = SumSegmentTree(8)
    with pytest.raises(IndexError, match="out of range"):
        tree.update(np.array([1, 8]), np.array([1.0, 1.0]))
    with pytest.raises(IndexError, match="out of range"):
        tree.update(np.array([-1]), np.array([1.0]))
    with pytest.raises(IndexError, match=re.escape("leaf range [6, 9) out of range [0, 8)")):
        tree.update_range(6, np.ones(3))
    with pytest.raises(ValueError, match=">= 0"):
        tree.find_prefixsum_idx(np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="NaN"):
        tree.find_prefixsum_idx(np.array([np.nan]))
    assert tree.sum() == 0.0


def test_next_power_of_two() -> None:
    """next_power_of_two(n) is the smallest power of two >= n."""
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 100_000)] == [1, 2, 4, 4, 8, 131072]


# -- uniform buffer -----------------------------------------------------------------------


def test_uniform_sample_returns_stored_rows_with_their_slots() -> None:
    """Each sampled row is the row stored in the slot its ``batch_indexes`` names, with the
    stored dtypes and shapes, and counters advance."""
    buffer = ReplayBuffer(100, seed=1)
    buffer.add_batch(cartpole_batch(60))
    out = buffer.sample(200)
    assert out.count == 200
    slots = out[SampleBatch.BATCH_INDEXES]
    assert slots.dtype == np.int64 and slots.min() >= 0 and slots.max() < 60
    expected = cartpole_batch(60).take(slots)
    for name, column in expected.items():
        np.testing.assert_array_equal(out[name], column)
        assert out[name].dtype == column.dtype
    assert buffer.stats()["sampled_count"] == 200
    assert len(buffer) == 60


def test_uniform_sampling_frequencies() -> None:
    """Uniform sampling: slot counts over 16 rows pass a chi-square test (dof 15, p=0.001)."""
    buffer = ReplayBuffer(16, seed=2)
    buffer.add_batch(cartpole_batch(16))
    draws = np.concatenate([buffer.sample(1000)[SampleBatch.BATCH_INDEXES] for _ in range(20)])
    observed = np.bincount(draws, minlength=16)
    statistic = chi_square(observed, np.full(16, len(draws) / 16))
    assert statistic < CHI2_999[15], f"chi2={statistic:.1f}, counts={observed.tolist()}"


def sequential_reference(capacity: int, sizes: list[int]) -> list[int]:
    """Row number held by each slot after adding rows one at a time, FIFO."""
    slots = [-1] * capacity
    next_slot, row = 0, 0
    for size in sizes:
        for _ in range(size):
            slots[next_slot] = row
            next_slot = (next_slot + 1) % capacity
            row += 1
    return [r for r in slots if r >= 0]


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 12), sizes=st.lists(st.integers(0, 30), min_size=1, max_size=8))
def test_wraparound_matches_sequential_adds(capacity: int, sizes: list[int]) -> None:
    """Batches that wrap past the end, or exceed the capacity, leave exactly what adding
    their rows one by one would, with the same length and added count."""
    buffer = ReplayBuffer(capacity, seed=0)
    row = 0
    for size in sizes:
        buffer.add_batch(cartpole_batch(size, start=row))
        row += size
    expected = sequential_reference(capacity, sizes)
    assert len(buffer) == len(expected)
    assert buffer.stats()["added_count"] == sum(sizes)
    if expected:
        held = buffer.rows_at(np.arange(len(buffer)))
        assert held["eps_id"].tolist() == expected
        np.testing.assert_array_equal(held["obs"], cartpole_batch(row).take(expected)["obs"])


def test_batch_straddling_the_end() -> None:
    """A 4-row batch added at slot 8 of a 10-slot buffer fills slots 8, 9, 0, 1."""
    buffer = ReplayBuffer(10)
    buffer.add_batch(cartpole_batch(8))
    buffer.add_batch(cartpole_batch(4, start=100))
    assert buffer.rows_at(np.arange(10))["eps_id"].tolist() == [
        102, 103, 2, 3, 4, 5, 6, 7, 100, 101,
    ]  # fmt: skip


def test_uniform_buffer_rejects_mismatched_batches_and_empty_sampling() -> None:
    """Sampling an empty buffer, adding other columns, other row shapes or an unsafe dtype
    are ValueErrors; a rejected batch changes nothing."""
    buffer = ReplayBuffer(10)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(4)
    buffer.add_batch(cartpole_batch(3))
    good = cartpole_batch(2)
    with pytest.raises(ValueError, match="missing"):
        buffer.add_batch(SampleBatch({k: v for k, v in good.items() if k != "rewards"}))
    with pytest.raises(ValueError, match="shape"):
        buffer.add_batch(SampleBatch(dict(good, obs=np.zeros((2, 5), np.float32))))
    with pytest.raises(ValueError, match="dtype"):
        buffer.add_batch(SampleBatch(dict(good, actions=np.zeros(2, np.float64))))
    with pytest.raises(ValueError, match="num_items"):
        buffer.sample(-1)
    assert len(buffer) == 3 and buffer.stats()["added_count"] == 3


def test_uniform_buffer_is_deterministic_with_seed() -> None:
    """Two buffers with the same seed and adds sample the same slots; another seed differs."""

    def draws(seed: int) -> list[int]:
        buffer = ReplayBuffer(50, seed=seed)
        buffer.add_batch(cartpole_batch(50))
        return buffer.sample(64)[SampleBatch.BATCH_INDEXES].tolist()

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_uniform_stats_and_evicted_hits() -> None:
    """stats() reports RLlib's counters; with debug, the sample counts of evicted rows."""
    buffer = ReplayBuffer(4, seed=0)
    buffer.add_batch(cartpole_batch(4))
    buffer.sample(40)
    buffer.add_batch(cartpole_batch(4, start=4))  # evicts all four sampled rows
    stats = buffer.stats(debug=True)
    row_bytes = 4 * 4 * 2 + 8 + 4 + 1 + 1 + 8
    assert stats["added_count"] == 8 and stats["sampled_count"] == 40
    assert stats["num_entries"] == 4 and stats["est_size_bytes"] == 4 * row_bytes
    assert stats["evicted_hit_count"] == 4
    assert stats["evicted_hit_mean"] == pytest.approx(10.0)


def test_evicted_hit_counts_follow_the_rows() -> None:
    """Before the buffer is full, the first eviction hits slot 0; a slot's sample count is
    the count of the row in it, and starts at zero for the row that replaces it."""
    buffer = ReplayBuffer(4, seed=0)
    buffer.add_batch(cartpole_batch(1))
    buffer.sample(10)  # slot 0 is the only row: 10 hits
    buffer.add_batch(cartpole_batch(1, start=1))  # slot 1
    buffer.add_batch(cartpole_batch(3, start=2))  # slots 2, 3, 0: evicts row 0 only
    stats = buffer.stats(debug=True)
    assert (stats["evicted_hit_count"], stats["evicted_hit_mean"]) == (1, 10.0)
    buffer.add_batch(cartpole_batch(4, start=5))  # evicts slots 1, 2, 3, 0: none sampled
    stats = buffer.stats(debug=True)
    assert (stats["evicted_hit_count"], stats["evicted_hit_mean"]) == (5, 2.0)


# -- prioritized buffer -------------------------------------------------------------------


def prioritized(capacity: int, rows: int, alpha: float = 0.6, seed: int = 0):
    buffer = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha), seed=seed)
    buffer.add_batch(cartpole_batch(rows))
    return buffer


def test_sampling_frequency_proportional_to_priority_power_alpha() -> None:
    """Rows are drawn with probability p_i^alpha / sum p^alpha: counts over 8 rows with
    priorities 1..8 pass a chi-square test (dof 7, p=0.001). Sampling by p (alpha ignored)
    would give a statistic in the thousands."""
    alpha = 0.7
    buffer = prioritized(8, 8, alpha=alpha, seed=5)
    priorities = np.arange(1, 9, dtype=float)
    buffer.update_priorities(np.arange(8), priorities)
    draws = np.concatenate(
        [buffer.sample(500)[SampleBatch.BATCH_INDEXES] for _ in range(100)]
    )
    observed = np.bincount(draws, minlength=8)
    mass = priorities**alpha
    statistic = chi_square(observed, len(draws) * mass / mass.sum())
    assert statistic < CHI2_999[7], f"chi2={statistic:.1f}, counts={observed.tolist()}"


def test_stratified_sampling_takes_one_row_per_equal_stratum() -> None:
    """With equal priorities and as many draws as rows, each stratum holds exactly one row,
    so every row is drawn exactly once (independent draws would almost surely repeat)."""
    buffer = prioritized(32, 32, seed=9)
    for _ in range(5):
        slots = buffer.sample(32)[SampleBatch.BATCH_INDEXES]
        assert sorted(slots.tolist()) == list(range(32))


def test_importance_weights_match_direct_formula() -> None:
    """weights == (N P(i))^-beta / max_j (N P(j))^-beta, with P(i) = p_i^a / sum_k p_k^a over
    the N rows held, computed directly; the largest possible weight is 1."""
    alpha, beta = 0.6, 0.4
    rng = np.random.default_rng(11)
    buffer = prioritized(64, 40, alpha=alpha, seed=3)  # 40 of 64 slots used
    priorities = rng.random(40) * 5 + 0.01
    buffer.update_priorities(np.arange(40), priorities)
    buffer.sampler.beta = beta
    out = buffer.sample(256)
    slots = out[SampleBatch.BATCH_INDEXES]
    n_rows = 40
    probability = priorities**alpha / np.sum(priorities**alpha)
    max_weight = np.max((n_rows * probability) ** -beta)
    expected = (n_rows * probability[slots]) ** -beta / max_weight
    assert out[SampleBatch.WEIGHTS].dtype == np.float32
    np.testing.assert_allclose(out[SampleBatch.WEIGHTS], expected, rtol=1e-6)
    assert out[SampleBatch.WEIGHTS].max() <= 1.0
    buffer.sampler.beta = 0.0
    np.testing.assert_array_equal(buffer.sample(64)[SampleBatch.WEIGHTS], np.ones(64, np.float32))


def test_prioritized_sample_returns_stored_rows() -> None:
    """Prioritized samples carry the stored rows of the slots in ``batch_indexes``."""
    buffer = prioritized(16, 12, seed=4)
    buffer.sampler.beta = 0.5
    out = buffer.sample(30)
    expected = cartpole_batch(12).take(out[SampleBatch.BATCH_INDEXES])
    for name, column in expected.items():
        np.testing.assert_array_equal(out[name], column)


def test_new_rows_get_max_priority_and_overwritten_slots_take_it() -> None:
    """New rows get max_priority^alpha; a slot overwritten after wrap-around takes the new
    row's priority, in both the sum and the min tree (the old minimum disappears)."""
    alpha = 0.5
    buffer = prioritized(4, 4, alpha=alpha)
    np.testing.assert_allclose(buffer.sampler.priority_mass(np.arange(4)), 1.0)
    buffer.update_priorities(np.array([0, 1, 2, 3]), np.array([9.0, 0.01, 4.0, 0.25]))
    assert buffer.sampler.max_priority == 9.0
    assert buffer.stats()["priority_mass_min"] == pytest.approx(0.01**alpha)
    buffer.add_batch(cartpole_batch(2, start=10))  # overwrites slots 0 and 1
    np.testing.assert_allclose(buffer.sampler.priority_mass(np.arange(4)), [3.0, 3.0, 2.0, 0.5])
    stats = buffer.stats()
    assert stats["priority_mass_min"] == pytest.approx(0.5)
    assert stats["priority_mass_total"] == pytest.approx(8.5)


def test_update_priorities_validation() -> None:
    """Zero, negative, NaN and infinite priorities, mismatched lengths, non-integer and
    out-of-range indices are rejected with a clear error and change nothing."""
    buffer = prioritized(8, 6)
    before = buffer.sampler.priority_mass(np.arange(8)).copy()
    cases = [
        ([0, 1], [1.0, 0.0], ValueError, "finite and > 0, got 0.0 at position 1"),
        ([0, 1], [-2.0, 1.0], ValueError, "> 0, got -2.0 at position 0"),
        ([0, 1], [1.0, np.nan], ValueError, "got nan at position 1"),
        ([0, 1], [np.inf, 1.0], ValueError, "got inf at position 0"),
        ([0, 1, 2], [1.0, 1.0], ValueError, "equal length"),
        ([0.0, 1.0], [1.0, 1.0], ValueError, "integers"),
        ([0, 6], [1.0, 1.0], IndexError, "slot 6 out of range"),
        ([-1, 2], [1.0, 1.0], IndexError, "slot -1"),
    ]
    for indices, priorities, error, message in cases:
        with pytest.raises(error, match=message):
            buffer.update_priorities(np.array(indices), np.array(priorities))
    np.testing.assert_array_equal(buffer.sampler.priority_mass(np.arange(8)), before)
    assert buffer.sampler.max_priority == 1.0


def test_update_priorities_duplicates_and_td_errors() -> None:
    """Duplicate slots keep the last priority; td errors become |td| + eps; max_priority is
    the largest priority set."""
    buffer = ReplayBuffer(8, sampler=PrioritizedSampler(1.0, eps=0.5))
    buffer.add_batch(cartpole_batch(8))
    buffer.update_priorities(np.array([2, 2, 3, 2]), np.array([5.0, 7.0, 2.0, 3.0]))
    assert buffer.sampler.priority_mass(np.array([2, 3])).tolist() == [3.0, 2.0]
    assert buffer.sampler.max_priority == 7.0
    buffer.update_priorities(np.array([4, 5]),
                             buffer.sampler.priorities_of(np.array([-2.0, 0.0])))
    assert buffer.sampler.priority_mass(np.array([4, 5])).tolist() == [2.5, 0.5]


def test_prioritized_constructor_validation() -> None:
    """Bad alpha, eps, beta and capacity are rejected with the value in the message."""
    with pytest.raises(ValueError, match=r"alpha must be >= 0, got -1\.0"):
        PrioritizedSampler(-1.0)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedSampler(float("nan"))
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0"):
        PrioritizedSampler(0.6, eps=0)
    with pytest.raises(ValueError, match="beta must be >= 0, got -0.1"):
        PrioritizedSampler(0.6, beta=-0.1)
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        ReplayBuffer(0, sampler=PrioritizedSampler(0.6))
    with pytest.raises(TypeError, match="capacity must be an int"):
        ReplayBuffer(10.5)  # type: ignore[arg-type]
    buffer = prioritized(4, 4)
    with pytest.raises(ValueError, match="beta must be >= 0, got -0.1"):
        buffer.sampler.beta = -0.1


def test_prioritized_is_deterministic_with_seed() -> None:
    """Same seed, same adds and updates: same slots and weights."""

    def run(seed: int) -> tuple[list[int], list[float]]:
        buffer = prioritized(64, 64, seed=seed)
        buffer.update_priorities(np.arange(64), np.linspace(0.1, 3.0, 64))
        out = buffer.sample(32)
        return out[SampleBatch.BATCH_INDEXES].tolist(), out[SampleBatch.WEIGHTS].tolist()

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_prioritized_stats() -> None:
    """stats() adds max_priority and priority masses; debug adds priority-change stats."""
    buffer = prioritized(8, 8, alpha=1.0)
    buffer.update_priorities(np.array([0, 1]), np.array([3.0, 0.5]))
    stats = buffer.stats(debug=True)
    assert stats["max_priority"] == 3.0
    assert stats["priority_mass_total"] == pytest.approx(6 + 3.0 + 0.5)
    assert stats["priority_mass_min"] == pytest.approx(0.5)
    assert stats["reprio_count"] == 2
    assert stats["reprio_mean"] == pytest.approx(((3.0 - 1.0) + (0.5 - 1.0)) / 2)
    assert {"added_count", "sampled_count", "est_size_bytes", "num_entries"} <= stats.keys()
    empty = ReplayBuffer(8, sampler=PrioritizedSampler(0.6)).stats()
    assert empty["priority_mass_total"] == 0.0 and empty["num_entries"] == 0


def test_prioritized_capacity_not_power_of_two_never_samples_empty_slots() -> None:
    """With capacity 100 (tree of 128 leaves) and a partly filled buffer, sampled slots are
    always rows held, even with all mass at the end."""
    buffer = prioritized(100, 37, seed=6)
    buffer.update_priorities(np.arange(37), np.r_[np.full(36, 1e-6), 1e6])
    slots = buffer.sample(4096)[SampleBatch.BATCH_INDEXES]
    assert slots.max() <= 36 and slots.min() >= 0


def test_replay_imports_neither_asyncio_nor_transport() -> None:
    """The replay package stays plain code: its modules import neither asyncio nor the
    transport layer (checked on the source, independent of what else is loaded)."""
    import ast
    import inspect

    from actorrl.replay import (
        buffer,
        frame_storage,
        prioritized,
        sampler,
        segment_tree,
        storage,
    )

    for module in (buffer, frame_storage, prioritized, sampler, segment_tree, storage):
        tree = ast.parse(inspect.getsource(module))
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {m for m in imported if m.split(".")[0] in {"asyncio", "transport"}}, imported


def test_given_priorities_set_the_new_rows_mass_even_across_the_end() -> None:
    """add_batch(priorities=...) gives each new row mass p ** alpha (Ape-X's worker-side
    initial priorities), also for a batch that wraps past the end of the storage."""
    buffer = ReplayBuffer(8, sampler=PrioritizedSampler(0.5), seed=0)
    buffer.add_batch(cartpole_batch(6))
    priorities = np.array([1.0, 4.0, 9.0, 16.0], dtype=np.float64)
    buffer.add_batch(cartpole_batch(4, start=6), priorities=priorities)
    slots = np.array([6, 7, 0, 1])
    np.testing.assert_allclose(buffer.sampler.priority_mass(slots), np.sqrt(priorities))
    assert buffer.sampler.priority_mass(np.array([2]))[0] == pytest.approx(1.0)  # untouched row


def test_replay_shards_accept_the_apex_options() -> None:
    """Both shard kinds take the options the Ape-X algorithm passes (a constructor that
    refused one would only fail inside a spawned actor)."""
    from actorrl.replay.actor import BatchReplayActor, ReplayActor
    from actorrl.replay.config import ReplayConfig

    config = ReplayConfig(num_replay_buffer_shards=2, learning_starts=100, buffer_size=1000,
                          train_batch_size=32, worker_side_prioritization=True)
    for cls in (ReplayActor, BatchReplayActor):
        for form in (config, config.to_dict()):  # typed, or as it crosses to a process
            shard = cls(form, seed=1)
            assert shard.config == config
            assert shard.replay_starts == 50 and shard.buffer_size == 500
        with pytest.raises(TypeError, match="positional arguments"):
            cls(2, 100, 1000, 32, 0.6, 0.4, 1e-6, True, seed=1)  # the old positional form
