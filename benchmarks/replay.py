"""Prioritized replay throughput: actorrl's vectorized buffer against a per-item Python one.

Workload (CartPole-sized rows: obs/new_obs float32[4], actions int64, rewards float32,
terminateds/truncateds bool, weights float32):

1. add 50-row batches until 100k rows are stored;
2. repeat ``sample(512, beta=0.4)`` + ``update_priorities`` with 512 new priorities.

The reference is the classic OpenAI-baselines / RLlib (<= 1.x) prioritized buffer, written
here from its description: a list of per-row tuples, a sum and a min segment tree kept in
Python lists, and a Python loop per row for add, sample and update. If ``cpprb`` (C++) is
importable it is measured on the same workload.

Prints one JSON object. ``--quick`` finishes in well under 40 s on the 2-core dev machine.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actorrl.batch import SampleBatch  # noqa: E402
from actorrl.replay import PrioritizedReplayBuffer  # noqa: E402

CAPACITY = 100_000
ROWS_PER_ADD = 50
SAMPLE_SIZE = 512
ALPHA = 0.6
BETA = 0.4
TARGET_SAMPLE_UPDATE_SPEEDUP = 20.0
TARGET_ADD_SPEEDUP = 10.0


# -- the per-item reference ---------------------------------------------------------------


class _ListSegmentTree:
    """Segment tree in a Python list, one item per call (baselines style)."""

    def __init__(self, capacity: int, operation: Callable[[float, float], float], neutral: float):
        self.capacity = capacity
        self.operation = operation
        self.values = [neutral] * (2 * capacity)

    def __setitem__(self, leaf: int, value: float) -> None:
        node = leaf + self.capacity
        self.values[node] = value
        node //= 2
        while node >= 1:
            self.values[node] = self.operation(self.values[2 * node], self.values[2 * node + 1])
            node //= 2

    def __getitem__(self, leaf: int) -> float:
        return self.values[leaf + self.capacity]

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """``operation`` over leaves ``start .. end - 1``, by recursive descent."""
        end = self.capacity if end is None else end
        return self._reduce(start, end - 1, 1, 0, self.capacity - 1)

    def _reduce(self, start: int, end: int, node: int, node_start: int, node_end: int) -> float:
        if start == node_start and end == node_end:
            return self.values[node]
        middle = (node_start + node_end) // 2
        if end <= middle:
            return self._reduce(start, end, 2 * node, node_start, middle)
        if start > middle:
            return self._reduce(start, end, 2 * node + 1, middle + 1, node_end)
        return self.operation(
            self._reduce(start, middle, 2 * node, node_start, middle),
            self._reduce(middle + 1, end, 2 * node + 1, middle + 1, node_end),
        )

    def find_prefixsum_idx(self, prefixsum: float) -> int:
        node = 1
        while node < self.capacity:
            left = self.values[2 * node]
            if left > prefixsum:
                node = 2 * node
            else:
                prefixsum -= left
                node = 2 * node + 1
        return node - self.capacity


class ReferencePrioritizedBuffer:
    """Per-item prioritized replay as in OpenAI baselines and RLlib's old ReplayBuffer."""

    def __init__(self, size: int, alpha: float) -> None:
        self.maxsize = size
        self.alpha = alpha
        self.storage: list[tuple[Any, ...]] = []
        self.next_idx = 0
        capacity = 1
        while capacity < size:
            capacity *= 2
        self.it_sum = _ListSegmentTree(capacity, operator.add, 0.0)
        self.it_min = _ListSegmentTree(capacity, min, float("inf"))
        self.max_priority = 1.0

    def add(self, *row: Any) -> None:
        idx = self.next_idx
        if idx >= len(self.storage):
            self.storage.append(row)
        else:
            self.storage[idx] = row
        self.next_idx = (idx + 1) % self.maxsize
        self.it_sum[idx] = self.max_priority**self.alpha
        self.it_min[idx] = self.max_priority**self.alpha

    def add_batch(self, batch: SampleBatch) -> None:
        """One ``add`` per row, as RLlib's ReplayActor did."""
        columns = [batch[name] for name in batch]
        for i in range(batch.count):
            self.add(*[column[i] for column in columns])

    def sample(self, batch_size: int, beta: float) -> tuple[Any, ...]:
        indexes = []
        for _ in range(batch_size):
            mass = random.random() * self.it_sum.reduce(0, len(self.storage))
            indexes.append(self.it_sum.find_prefixsum_idx(mass))
        total = self.it_sum.reduce()
        p_min = self.it_min.reduce() / total
        max_weight = (p_min * len(self.storage)) ** (-beta)
        weights = []
        for idx in indexes:
            p_sample = self.it_sum[idx] / total
            weights.append((p_sample * len(self.storage)) ** (-beta) / max_weight)
        fields: list[list[Any]] = [[] for _ in self.storage[0]]
        for idx in indexes:
            for field, value in zip(fields, self.storage[idx]):
                field.append(np.asarray(value))
        return (*[np.array(field) for field in fields], np.array(weights), np.array(indexes))

    def update_priorities(self, indexes: Any, priorities: Any) -> None:
        for idx, priority in zip(indexes, priorities):
            assert priority > 0
            assert 0 <= idx < len(self.storage)
            self.it_sum[idx] = priority**self.alpha
            self.it_min[idx] = priority**self.alpha
            self.max_priority = max(self.max_priority, priority)


# -- workload -----------------------------------------------------------------------------


def make_batches(count: int, rng: np.random.Generator) -> list[SampleBatch]:
    """``count`` distinct 50-row CartPole-sized batches."""
    n = ROWS_PER_ADD
    return [
        SampleBatch(
            obs=rng.standard_normal((n, 4), dtype=np.float32),
            new_obs=rng.standard_normal((n, 4), dtype=np.float32),
            actions=rng.integers(0, 2, n, dtype=np.int64),
            rewards=np.ones(n, dtype=np.float32),
            terminateds=rng.random(n) < 0.02,
            truncateds=np.zeros(n, dtype=bool),
            weights=np.ones(n, dtype=np.float32),
        )
        for _ in range(count)
    ]


def timed_rounds(step: Callable[[int], None], duration_s: float) -> float:
    """Call ``step(i)`` for i = 0, 1, ... for about ``duration_s``; rounds per second."""
    rounds = 0
    start_s = time.perf_counter()
    elapsed_s = 0.0
    while elapsed_s < duration_s:
        for _ in range(8):
            step(rounds)
            rounds += 1
        elapsed_s = time.perf_counter() - start_s
    return rounds / elapsed_s


def fill_ours(batches: list[SampleBatch], propagate_every_add: bool) -> tuple[Any, float]:
    """A fresh buffer filled to 100k rows; returns it and the seconds taken.

    The trees propagate writes lazily; the timing ends with a query (``stats()`` reads the
    total and min mass), so the deferred propagation is paid inside it. With
    ``propagate_every_add`` a query follows every add: the eager cost.
    """
    buffer = PrioritizedReplayBuffer(CAPACITY, ALPHA, seed=0)
    start_s = time.perf_counter()
    i = 0
    while len(buffer) < CAPACITY:
        buffer.add_batch(batches[i % len(batches)])
        if propagate_every_add:
            buffer.stats()
        i += 1
    buffer.stats()
    return buffer, time.perf_counter() - start_s


def measure_ours_add(batches: list[SampleBatch], duration_s: float, eager: bool) -> float:
    """Rows added per second over repeated 100k fills lasting about ``duration_s``."""
    rows, total_s = 0, 0.0
    while total_s < duration_s:
        _, fill_s = fill_ours(batches, eager)
        rows += CAPACITY
        total_s += fill_s
    return rows / total_s


def measure_sample_update(
    sample: Callable[[], np.ndarray],
    update: Callable[[np.ndarray, np.ndarray], None],
    priorities: list[np.ndarray],
    duration_s: float,
) -> float:
    """Rounds of sample(512) + update_priorities(512) per second."""

    def step(i: int) -> None:
        indexes = sample()
        update(indexes, priorities[i % len(priorities)])

    return timed_rounds(step, duration_s)


def measure_cpprb(
    batches: list[SampleBatch], priorities: list[np.ndarray], duration_s: float
) -> dict[str, float] | None:
    """cpprb's PrioritizedReplayBuffer on the same workload, or None when not installed."""
    try:
        import cpprb
    except ImportError:
        return None
    env_dict = {
        name: {"shape": column.shape[1:] or 1, "dtype": column.dtype}
        for name, column in batches[0].items()
        if name != SampleBatch.WEIGHTS
    }
    buffer = cpprb.PrioritizedReplayBuffer(CAPACITY, env_dict, alpha=ALPHA)
    columns = [{k: v for k, v in b.items() if k != SampleBatch.WEIGHTS} for b in batches]
    start_s = time.perf_counter()
    i = 0
    while buffer.get_stored_size() < CAPACITY:
        buffer.add(**columns[i % len(columns)])
        i += 1
    add_per_s = buffer.get_stored_size() / (time.perf_counter() - start_s)
    rounds_per_s = measure_sample_update(
        lambda: buffer.sample(SAMPLE_SIZE, beta=BETA)["indexes"],
        buffer.update_priorities,
        priorities,
        duration_s,
    )
    return {"add_per_s": add_per_s, "sample_update_per_s": rounds_per_s}


def run(quick: bool) -> dict[str, Any]:
    """Run every measurement and return the JSON-ready results."""
    duration_s = 2.0 if quick else 8.0
    rng = np.random.default_rng(0)
    random.seed(0)
    batches = make_batches(64, rng)
    priorities = [rng.random(SAMPLE_SIZE) + 1e-3 for _ in range(16)]

    add_per_s = measure_ours_add(batches, duration_s, eager=False)
    add_eager_per_s = measure_ours_add(batches, duration_s / 2, eager=True)
    ours, _ = fill_ours(batches, propagate_every_add=False)
    sample_update_per_s = measure_sample_update(
        lambda: ours.sample(SAMPLE_SIZE, beta=BETA)[SampleBatch.BATCH_INDEXES],
        ours.update_priorities,
        priorities,
        duration_s,
    )

    reference = ReferencePrioritizedBuffer(CAPACITY, ALPHA)
    start_s = time.perf_counter()
    i = 0
    while len(reference.storage) < CAPACITY:
        reference.add_batch(batches[i % len(batches)])
        i += 1
    ref_add_per_s = len(reference.storage) / (time.perf_counter() - start_s)
    ref_sample_update_per_s = measure_sample_update(
        lambda: reference.sample(SAMPLE_SIZE, BETA)[-1],
        reference.update_priorities,
        priorities,
        duration_s,
    )

    add_speedup = add_per_s / ref_add_per_s
    sample_update_speedup = sample_update_per_s / ref_sample_update_per_s
    result: dict[str, Any] = {
        "benchmark": "prioritized_replay",
        "quick": quick,
        "capacity": CAPACITY,
        "rows_per_add": ROWS_PER_ADD,
        "sample_size": SAMPLE_SIZE,
        "alpha": ALPHA,
        "beta": BETA,
        "duration_s_per_measurement": duration_s,
        "add_per_s": round(add_per_s),
        "add_eager_per_s": round(add_eager_per_s),
        "add_timing_includes_tree_propagation": True,
        "ref_add_per_s": round(ref_add_per_s),
        "ref_add_items": len(reference.storage),
        "add_speedup": round(add_speedup, 2),
        "sample_update_per_s": round(sample_update_per_s, 1),
        "ref_sample_update_per_s": round(ref_sample_update_per_s, 2),
        "sample_update_speedup": round(sample_update_speedup, 2),
        "target_add_speedup": TARGET_ADD_SPEEDUP,
        "target_sample_update_speedup": TARGET_SAMPLE_UPDATE_SPEEDUP,
        "targets_met": {
            "add_speedup": add_speedup >= TARGET_ADD_SPEEDUP,
            "sample_update_speedup": sample_update_speedup >= TARGET_SAMPLE_UPDATE_SPEEDUP,
        },
    }
    cpprb_result = measure_cpprb(batches, priorities, duration_s)
    result["cpprb_available"] = cpprb_result is not None
    if cpprb_result is not None:
        result["cpprb_add_per_s"] = round(cpprb_result["add_per_s"])
        result["cpprb_sample_update_per_s"] = round(cpprb_result["sample_update_per_s"], 1)
        result["vs_cpprb"] = round(sample_update_per_s / cpprb_result["sample_update_per_s"], 2)
        result["add_vs_cpprb"] = round(add_per_s / cpprb_result["add_per_s"], 2)
    return result


def main() -> None:
    """Parse arguments, run, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short measurements (< 40 s)")
    args = parser.parse_args()
    print(json.dumps(run(args.quick)))


if __name__ == "__main__":
    main()
