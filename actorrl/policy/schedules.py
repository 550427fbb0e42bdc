"""Piecewise-linear schedules over the global env-step count (RLlib's ``lr_schedule`` and
``entropy_coeff_schedule``).

A schedule is written as RLlib writes it: a list of ``[timestep, value]`` pairs, the
timesteps non-decreasing and the first one 0. Between two points the value is interpolated
linearly; after the last point it stays at the last value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_schedule(key: str, endpoints: Any, *, min_value: float = 0.0) -> list[str]:
    """Problems with the schedule given for config key ``key`` (empty when valid): a list
    of ``[timestep, value]`` pairs starting at timestep 0, timesteps non-decreasing,
    values ``>= min_value``."""
    if endpoints is None:
        return []
    example = f"e.g. {key}: [[0, 0.0005], [20000000, 0.000001]]"
    if not isinstance(endpoints, (list, tuple)) or not endpoints:
        return [f"{key} must be a non-empty list of [timestep, value] pairs ({example}), "
                f"got {endpoints!r}"]
    problems = []
    for i, point in enumerate(endpoints):
        if not isinstance(point, (list, tuple)) or len(point) != 2 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in point):
            problems.append(f"{key}[{i}] must be a [timestep, value] pair of numbers, "
                            f"got {point!r}")
    if problems:
        return problems
    times = [p[0] for p in endpoints]
    if times[0] != 0:
        problems.append(f"{key} must start at timestep 0 (RLlib's schedules do; "
                        f"{example}), got {times[0]!r}")
    if any(b < a for a, b in zip(times, times[1:])):
        problems.append(f"{key} timesteps must be non-decreasing, got {times}")
    bad = [p[1] for p in endpoints if p[1] < min_value]
    if bad:
        problems.append(f"{key} values must be >= {min_value}, got {bad}")
    return problems


class PiecewiseSchedule:
    """A value that follows ``endpoints`` (``[(timestep, value), ...]``, validated by
    :func:`check_schedule`) linearly over timesteps, holding the last value after the
    last point."""

    def __init__(self, endpoints: Sequence[Sequence[float]]) -> None:
        self.endpoints = [(float(t), float(v)) for t, v in endpoints]

    def value(self, timestep: float) -> float:
        """The scheduled value at ``timestep``."""
        points = self.endpoints
        if timestep <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t0 <= timestep < t1:
                return v0 + (timestep - t0) / (t1 - t0) * (v1 - v0)
        return points[-1][1]
