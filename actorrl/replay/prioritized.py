"""Proportional prioritized sampling (Schaul et al. 2016), as RLlib's prioritized buffer.

Row ``i`` is drawn with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` and weighted by
``(N * P(i))^-beta / max_j (N * P(j))^-beta``. The masses ``p^alpha`` live in a sum and a
min :mod:`~actorrl.replay.segment_tree`; drawing, weighting and updating are a few numpy
calls per batch, never a Python loop per row.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from actorrl.replay.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    last_writes,
    next_power_of_two,
)
from actorrl.replay.storage import Storage, Written
from actorrl.util.stats import WindowStat

REPRIORITIZATION_WINDOW = 1000
"""How many priority changes ``stats(debug=True)`` summarises."""


class PrioritizedSampler:
    """A :class:`~actorrl.replay.sampler.Sampler` drawing rows in proportion to
    ``priority ** alpha``, with importance weights of exponent ``beta``.

    New rows get priority ``max_priority`` (the largest ever set, initially 1). ``sample``
    draws one row per equal-mass stratum of the total and returns the importance weights
    ``(N * P(i)) ** -beta / (N * P_min) ** -beta`` (float32, max 1). An overwritten slot
    takes the new row's priority; a retired one has zero mass, and later updates to it
    are dropped by the buffer. ``eps`` is what :meth:`priorities_of` adds to ``|td_error|``.
    """

    def __init__(self, alpha: float, beta: float = 0.4, eps: float = 1e-6) -> None:
        if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {float(alpha)}")
        if not (isinstance(eps, numbers.Real) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        self.alpha = float(alpha)
        """Prioritization exponent: 0 is uniform, 1 fully proportional."""
        self.eps = float(eps)
        """Added to ``|td_error|`` to keep priorities positive."""
        self.beta = beta
        self._sum_tree = SumSegmentTree(1)
        self._min_tree = MinSegmentTree(1)
        self._max_priority = 1.0
        self._holds_rows = False
        self._reprio_stats = WindowStat("reprio", REPRIORITIZATION_WINDOW)
        self._strata = np.zeros(0)

    @property
    def beta(self) -> float:
        """Importance-weight exponent (0: all weights 1); may be changed between samples."""
        return self._beta

    @beta.setter
    def beta(self, beta: float) -> None:
        if not beta >= 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._beta = float(beta)

    @property
    def max_priority(self) -> float:
        """Largest priority ever set (before ``** alpha``); new rows get it."""
        return self._max_priority

    def bind(self, capacity: int) -> None:
        """Trees with a leaf per slot (rounded up to a power of two)."""
        tree_capacity = next_power_of_two(capacity)
        self._sum_tree = SumSegmentTree(tree_capacity)
        self._min_tree = MinSegmentTree(tree_capacity)

    def priority_mass(self, slots: np.ndarray) -> np.ndarray:
        """Sampling mass ``priority ** alpha`` of the rows at ``slots``."""
        return self._sum_tree.get(np.asarray(slots, dtype=np.intp))

    def priorities_of(self, td_errors: np.ndarray) -> np.ndarray:
        """``|td_error| + eps``: the Ape-X replay shard's priorities."""
        return np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps

    def on_write(self, written: Written) -> None:
        """New rows get mass ``max_priority ** alpha``."""
        self._holds_rows = self._holds_rows or written.count > 0
        mass = self._max_priority ** self.alpha
        for start, stop, _ in written.segments:
            self._sum_tree.fill_range(start, stop, mass)
            self._min_tree.fill_range(start, stop, mass)

    def on_retire(self, slots: np.ndarray) -> None:
        """Retired rows get zero mass (and drop out of the minimum)."""
        self._sum_tree.update(slots, 0.0, unique=True)
        self._min_tree.update(slots, math.inf, unique=True)

    def sample(self, num_items: int, storage: Storage,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional draws: the total mass is cut into ``num_items`` equal
        strata and one uniform point is drawn in each, so every row is drawn with
        probability proportional to its mass, covering the distribution more evenly than
        independent draws."""
        total_mass = self._sum_tree.sum()
        if len(self._strata) != num_items:
            self._strata = np.arange(num_items, dtype=np.float64)
        points = self._strata + rng.random(num_items)
        points *= total_mass / max(num_items, 1)
        slots = self._sum_tree.find_prefixsum_idx(points).astype(np.int64, copy=False)
        # (N P(i))^-beta / (N P_min)^-beta == (mass_min / mass_i)^beta; N and the total cancel.
        weights = np.power(self._min_tree.min() / self._sum_tree.get(slots), self._beta)
        return slots, weights.astype(np.float32)

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Mass ``priority ** alpha`` for each slot, the last of duplicates winning."""
        self._holds_rows = self._holds_rows or len(slots) > 0
        largest = float(priorities.max())
        slots, values = last_writes(slots, priorities)
        mass = values if self.alpha == 1.0 else np.power(values, self.alpha)
        self._reprio_stats.push_many(mass - self._sum_tree.get(slots))
        self._sum_tree.update(slots, mass, unique=True)
        self._min_tree.update(slots, mass, unique=True)
        self._max_priority = max(self._max_priority, largest)

    def stats(self, debug: bool) -> dict[str, Any]:
        """``max_priority``: largest priority set. ``priority_mass_total`` and
        ``priority_mass_min``: sum and minimum of ``priority ** alpha`` over the rows held
        (0.0 when empty); ``debug`` adds priority-change stats."""
        out: dict[str, Any] = {
            "max_priority": self._max_priority,
            "priority_mass_total": self._sum_tree.sum() if self._holds_rows else 0.0,
            "priority_mass_min": self._min_tree.min() if self._holds_rows else 0.0,
        }
        if debug:
            out.update(self._reprio_stats.stats())
        return out
