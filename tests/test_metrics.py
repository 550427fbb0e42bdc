"""Stats helpers: TimerStat on a fake clock, WindowStat against numpy, RunningStat (Welford)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorrl.util.stats import RunningStat, TimerStat, WindowStat


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


# -- TimerStat ----------------------------------------------------------------------------


def test_timer_measures_blocks_with_its_clock() -> None:
    """``with timer:`` records the clock's elapsed time; mean/sum/max/last follow."""
    clock = FakeClock()
    timer = TimerStat(clock=clock)
    for duration_s in (0.5, 1.5, 1.0):
        with timer:
            clock.now_s += duration_s
    assert timer.count == 3 and timer.size == 3
    assert timer.mean == pytest.approx(1.0)
    assert timer.sum == pytest.approx(3.0)
    assert timer.max == pytest.approx(1.5)
    assert timer.median == pytest.approx(1.0)
    assert (timer.first, timer.last) == (pytest.approx(0.5), pytest.approx(1.0))


def test_timer_records_even_when_the_block_raises() -> None:
    """A block that raises is still timed, and the timer is usable afterwards."""
    clock = FakeClock()
    timer = TimerStat(clock=clock)
    with pytest.raises(KeyError, match="boom"), timer:
        clock.now_s += 2.0
        raise KeyError("boom")
    assert timer.last == pytest.approx(2.0)
    with timer:
        clock.now_s += 1.0
    assert timer.count == 2


def test_timer_window_and_throughput() -> None:
    """Stats cover the last window_size pushes (default 10); throughput is units over time
    in that window; count and total_time_s cover everything."""
    timer = TimerStat()
    assert timer.window_size == 10
    assert (timer.mean, timer.mean_units_processed, timer.mean_throughput) == (0.0, 0.0, 0.0)
    for i in range(15):
        timer.push(float(i + 1))
        timer.push_units_processed(10 * (i + 1))
    window = np.arange(6, 16, dtype=float)
    assert timer.size == 10 and timer.count == 15
    assert timer.mean == pytest.approx(window.mean())
    assert timer.mean_units_processed == pytest.approx(10 * window.mean())
    assert timer.mean_throughput == pytest.approx(10.0)
    assert timer.total_time_s == pytest.approx(sum(range(1, 16)))
    assert timer.has_units_processed()
    timer.reset()
    assert (timer.count, timer.size, timer.mean) == (0, 0, 0.0)


def test_timer_rejects_nested_use_and_bad_window() -> None:
    """Entering a timer twice is an error (RLlib asserts); window_size must be >= 1."""
    timer = TimerStat(clock=FakeClock())
    with timer, pytest.raises(RuntimeError, match="already timing"), timer:
        pass
    with pytest.raises(ValueError, match="window_size"):
        TimerStat(window_size=0)


# -- WindowStat ---------------------------------------------------------------------------


def test_window_stat_keys_and_values_match_numpy() -> None:
    """For name "size", stats() has RLlib's size_count/mean/std/quantiles (percentiles
    0, 10, 50, 90, 100 of the last n values) plus min and max; count counts every push."""
    stat = WindowStat("size", 5)
    for value in [9.0, 1.0, 4.0, 2.0, 8.0, 3.0, 7.0]:
        stat.push(value)
    window = np.array([4.0, 2.0, 8.0, 3.0, 7.0])
    stats = stat.stats()
    assert set(stats) == {
        "size_count", "size_mean", "size_std", "size_quantiles", "size_min", "size_max",
    }  # fmt: skip
    assert stats["size_count"] == 7
    assert stats["size_mean"] == pytest.approx(window.mean())
    assert stats["size_std"] == pytest.approx(window.std())
    assert stats["size_quantiles"] == pytest.approx(
        np.percentile(window, [0, 10, 50, 90, 100]).tolist()
    )
    assert (stats["size_min"], stats["size_max"]) == (2.0, 8.0)
    assert stat.values().tolist() == window.tolist()


def test_window_stat_empty() -> None:
    """Before any push: count 0, NaN summaries, no quantiles, and no numpy warning."""
    stats = WindowStat("q", 3).stats()
    assert stats["q_count"] == 0 and stats["q_quantiles"] == []
    assert math.isnan(stats["q_mean"]) and math.isnan(stats["q_std"])


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 6),
    chunks=st.lists(st.lists(st.integers(-50, 50), max_size=14), max_size=6),
)
def test_push_many_equals_pushing_one_by_one(n: int, chunks: list[list[int]]) -> None:
    """push_many(values) leaves the window exactly as pushing each value in turn would."""
    many, single = WindowStat("x", n), WindowStat("x", n)
    for chunk in chunks:
        many.push_many(np.array(chunk, dtype=float))
        for value in chunk:
            single.push(value)
        assert many.values().tolist() == single.values().tolist()
        assert many.count == single.count


# -- RunningStat --------------------------------------------------------------------------


def test_running_stat_matches_numpy() -> None:
    """Welford's mean, sample variance (ddof=1) and std equal numpy's over the same data,
    for scalars and for vectors."""
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(500, 3)) * [1.0, 1e3, 1e-3]
    stat = RunningStat(shape=(3,))
    for row in data:
        stat.push(row)
    assert stat.n == 500
    np.testing.assert_allclose(stat.mean, data.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(stat.var, data.var(axis=0, ddof=1), rtol=1e-10)
    np.testing.assert_allclose(stat.std, data.std(axis=0, ddof=1), rtol=1e-10)
    scalar = RunningStat()
    for value in data[:, 0]:
        scalar.push(value)
    assert float(scalar.mean) == pytest.approx(data[:, 0].mean())
    assert float(scalar.var) == pytest.approx(data[:, 0].var(ddof=1))


def test_running_stat_is_stable_with_a_large_offset() -> None:
    """Values around 1e9 with unit spread keep an accurate variance (the naive
    sum-of-squares formula loses it entirely)."""
    rng = np.random.default_rng(1)
    data = 1e9 + rng.normal(size=2000)
    stat = RunningStat()
    for value in data:
        stat.push(value)
    assert float(stat.var) == pytest.approx(np.var(data, ddof=1), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    left=st.lists(st.floats(-1e3, 1e3), max_size=20),
    right=st.lists(st.floats(-1e3, 1e3), max_size=20),
)
def test_merge_equals_pushing_everything(left: list[float], right: list[float]) -> None:
    """update(other) gives the n, mean and variance of pushing both sides' values into one
    stat, including when either side is empty; other is unchanged."""
    a, b, both = RunningStat(), RunningStat(), RunningStat()
    for value in left:
        a.push(value)
        both.push(value)
    for value in right:
        b.push(value)
        both.push(value)
    b_before = (b.n, float(b.mean), float(b.var))
    a.update(b)
    assert a.n == both.n == len(left) + len(right)
    assert float(a.mean) == pytest.approx(float(both.mean), abs=1e-9)
    assert float(a.var) == pytest.approx(float(both.var), rel=1e-7, abs=1e-6)
    assert (b.n, float(b.mean), float(b.var)) == b_before


def test_running_stat_small_n_and_shape_errors() -> None:
    """Variance is zero below two observations; pushing or merging another shape fails;
    copy() is independent."""
    stat = RunningStat(shape=(2,))
    assert stat.var.tolist() == [0.0, 0.0]
    stat.push([1.0, 2.0])
    assert stat.mean.tolist() == [1.0, 2.0] and stat.var.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(3,\)"):
        stat.push([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="cannot merge"):
        stat.update(RunningStat(shape=(3,)))
    clone = stat.copy()
    clone.push([3.0, 4.0])
    assert stat.n == 1 and clone.n == 2
