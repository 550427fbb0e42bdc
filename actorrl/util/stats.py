"""Stats helpers equivalent to RLlib's ``TimerStat``, ``WindowStat`` and ``RunningStat``.

- ``TimerStat``: times a block (``with timer:``) or takes pushed durations, and keeps the
  last ``window_size`` durations and unit counts for mean time and throughput.
- ``WindowStat``: the last ``n`` values of a quantity, summarised with RLlib's keys
  (``<name>_count``, ``<name>_mean``, ``<name>_std``, ``<name>_quantiles``) plus
  ``<name>_min`` and ``<name>_max``.
- ``RunningStat``: Welford's running mean and variance over every value pushed, mergeable.

All are plain single-threaded objects; none of them reads a clock except ``TimerStat``,
which uses ``time.perf_counter`` unless given another clock (tests pass a fake one).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

QUANTILE_PERCENTS: tuple[int, ...] = (0, 10, 50, 90, 100)
"""Percentiles reported by ``WindowStat.stats()`` under ``<name>_quantiles``."""


class TimerStat:
    """Windowed timer: mean duration, mean units processed and throughput.

    Use as a context manager (``with timer: ...``) or push measured durations with
    ``push(seconds)``. Pair each timed block with ``push_units_processed(n)`` to get a
    throughput in units per second. Statistics cover the last ``window_size`` pushes;
    ``count`` and ``total_time_s`` cover every push since construction or ``reset()``.
    """

    def __init__(
        self, window_size: int = 10, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self._window_size = window_size
        self._clock = clock
        self._samples_s: deque[float] = deque(maxlen=window_size)
        self._units: deque[float] = deque(maxlen=window_size)
        self._start_s: float | None = None
        self.count = 0
        """Number of durations pushed since construction or the last ``reset()``."""
        self.total_time_s = 0.0
        """Sum of every duration pushed since construction or the last ``reset()``."""

    def __enter__(self) -> TimerStat:
        if self._start_s is not None:
            raise RuntimeError("TimerStat is already timing a block (nested use is not supported)")
        self._start_s = self._clock()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._start_s is not None
        elapsed_s = self._clock() - self._start_s
        self._start_s = None
        self.push(elapsed_s)

    @property
    def window_size(self) -> int:
        """How many of the most recent pushes the statistics cover."""
        return self._window_size

    def push(self, seconds: float) -> None:
        """Record one duration in seconds."""
        self._samples_s.append(float(seconds))
        self.count += 1
        self.total_time_s += float(seconds)

    def push_units_processed(self, n: float) -> None:
        """Record how many units (steps, samples, bytes) the latest timed block processed."""
        self._units.append(float(n))

    def has_units_processed(self) -> bool:
        """Whether any unit count is in the window."""
        return bool(self._units)

    @property
    def mean(self) -> float:
        """Mean duration in seconds over the window (0.0 when empty)."""
        return math.fsum(self._samples_s) / len(self._samples_s) if self._samples_s else 0.0

    @property
    def median(self) -> float:
        """Median duration in seconds over the window (0.0 when empty)."""
        return float(np.median(self._samples_s)) if self._samples_s else 0.0

    @property
    def sum(self) -> float:
        """Sum of the durations in the window, in seconds."""
        return math.fsum(self._samples_s)

    @property
    def max(self) -> float:
        """Longest duration in the window in seconds (0.0 when empty)."""
        return max(self._samples_s) if self._samples_s else 0.0

    @property
    def first(self) -> float | None:
        """Oldest duration in the window, or None."""
        return self._samples_s[0] if self._samples_s else None

    @property
    def last(self) -> float | None:
        """Newest duration in the window, or None."""
        return self._samples_s[-1] if self._samples_s else None

    @property
    def size(self) -> int:
        """Number of durations in the window."""
        return len(self._samples_s)

    @property
    def mean_units_processed(self) -> float:
        """Mean of the unit counts in the window (0.0 when empty)."""
        return math.fsum(self._units) / len(self._units) if self._units else 0.0

    @property
    def mean_throughput(self) -> float:
        """Units per second over the window: sum of units / sum of durations (0.0 if no time)."""
        total_s = math.fsum(self._samples_s)
        if total_s <= 0.0:
            return 0.0
        return math.fsum(self._units) / total_s

    def reset(self) -> None:
        """Forget every duration and unit count."""
        self._samples_s.clear()
        self._units.clear()
        self._start_s = None
        self.count = 0
        self.total_time_s = 0.0


class WindowStat:
    """The last ``n`` values of a named quantity, summarised with RLlib's stats keys.

    ``stats()`` for name ``"size"`` returns ``size_count`` (values pushed in total, not only
    those still in the window), ``size_mean``, ``size_std`` (population std),
    ``size_quantiles`` (the [0, 10, 50, 90, 100] percentiles as a list, empty when nothing
    was pushed), ``size_min`` and ``size_max`` over the window. Mean, std, min and max are
    NaN when nothing was pushed. NaN values pushed are ignored by the summaries.
    """

    def __init__(self, name: str, n: int) -> None:
        if n < 1:
            raise ValueError(f"WindowStat window n must be >= 1, got {n}")
        self.name = name
        self._items = np.zeros(n, dtype=np.float64)
        self._next = 0
        self.count = 0
        """Number of values pushed since construction."""

    @property
    def window_size(self) -> int:
        """How many of the most recent values are kept."""
        return len(self._items)

    def push(self, value: float) -> None:
        """Record one value."""
        self._items[self._next] = value
        self._next = (self._next + 1) % len(self._items)
        self.count += 1

    def push_many(self, values: np.ndarray) -> None:
        """Record many values in order, as if pushed one by one (vectorized)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        n = len(self._items)
        total = len(values)
        if total == 0:
            return
        kept = values[-n:]
        # Slot of the first kept value, had every value been pushed one by one.
        start = (self._next + total - len(kept)) % n
        first = min(len(kept), n - start)
        self._items[start : start + first] = kept[:first]
        self._items[: len(kept) - first] = kept[first:]
        self._next = (self._next + total) % n
        self.count += total

    def values(self) -> np.ndarray:
        """The values in the window, oldest first (a copy)."""
        if self.count < len(self._items):
            return self._items[: self.count].copy()
        return np.roll(self._items, -self._next)

    def stats(self) -> dict[str, Any]:
        """Summary of the window under ``<name>_count/_mean/_std/_quantiles/_min/_max``."""
        window = self.values()
        window = window[~np.isnan(window)]
        if len(window) == 0:
            mean = std = low = high = math.nan
            quantiles: list[float] = []
        else:
            mean = float(np.mean(window))
            std = float(np.std(window))
            quantiles = np.percentile(window, QUANTILE_PERCENTS).tolist()
            low, high = quantiles[0], quantiles[-1]
        return {
            f"{self.name}_count": int(self.count),
            f"{self.name}_mean": mean,
            f"{self.name}_std": std,
            f"{self.name}_quantiles": quantiles,
            f"{self.name}_min": low,
            f"{self.name}_max": high,
        }


class RunningStat:
    """Running mean and variance of arrays of a fixed shape (Welford's algorithm).

    ``push(x)`` adds one observation of shape ``shape``; ``update(other)`` merges another
    RunningStat as if all of its observations had been pushed here (Chan et al.).
    ``var`` is the sample variance (divides by ``n - 1``); it is zero while ``n < 2``.
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self._n = 0
        self._mean = np.zeros(shape, dtype=np.float64)
        self._m2 = np.zeros(shape, dtype=np.float64)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one observation."""
        return self._mean.shape

    @property
    def n(self) -> int:
        """Number of observations so far."""
        return self._n

    @property
    def mean(self) -> np.ndarray:
        """Running mean (zeros before the first push)."""
        return self._mean

    @property
    def var(self) -> np.ndarray:
        """Sample variance (ddof=1); zeros while fewer than two observations."""
        if self._n < 2:
            return np.zeros_like(self._m2)
        return self._m2 / (self._n - 1)

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation, ``sqrt(var)``."""
        return np.sqrt(self.var)

    def push(self, x: Any) -> None:
        """Add one observation; its shape must equal ``shape``."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != self._mean.shape:
            raise ValueError(f"RunningStat expects shape {self._mean.shape}, got {x.shape}")
        self._n += 1
        delta = x - self._mean
        self._mean = self._mean + delta / self._n
        self._m2 = self._m2 + delta * (x - self._mean)

    def update(self, other: RunningStat) -> None:
        """Merge ``other``'s observations into this one (``other`` is unchanged)."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge RunningStat of shape {other.shape} into {self.shape}")
        n1, n2 = self._n, other._n
        n = n1 + n2
        if n2 == 0:
            return
        delta = other._mean - self._mean
        self._mean = self._mean + delta * (n2 / n)
        self._m2 = self._m2 + other._m2 + delta * delta * (n1 * n2 / n)
        self._n = n

    def copy(self) -> RunningStat:
        """An independent copy."""
        out = RunningStat(self.shape)
        out._n = self._n
        out._mean = self._mean.copy()
        out._m2 = self._m2.copy()
        return out

    def __repr__(self) -> str:
        return f"RunningStat(n={self._n}, mean={self._mean}, std={self.std})"
