"""Checks on the episode returns of the policy-level learning tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def window_reached(returns: Sequence[float], window: int, target: float) -> bool:
    """Whether the mean of the last ``window`` returns is at least ``target``."""
    return len(returns) >= window and float(np.mean(returns[-window:])) >= target


def assert_window_reached(returns: Sequence[float], env_steps: int, window: int,
                          target: float) -> None:
    """Fail naming the mean of the last ``window`` returns and the env steps it took,
    unless it reached ``target``."""
    assert window_reached(returns, window, target), (
        f"mean return of the last {window} episodes "
        f"{np.mean(returns[-window:]) if returns else float('nan'):.1f} after "
        f"{env_steps} env steps")
