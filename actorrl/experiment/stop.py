"""When training stops: a mean reward, a number of env steps, or wall time.

``reward`` is compared with ``episode_reward_mean`` and ``timesteps`` with
``timesteps_total`` (both include what a restored checkpoint had already done, as in RLlib);
``time_s`` counts this invocation's wall time since training started, so a resumed run gets
its full time budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_STOP_TIME_S = 600.0
CARTPOLE_SOLVED_REWARD = 450.0


def default_stop_reward(env: str) -> float | None:
    """450 for CartPole-v1 (solved), no reward criterion for other envs."""
    return CARTPOLE_SOLVED_REWARD if env == "CartPole-v1" else None


@dataclass(frozen=True, kw_only=True)
class StopCriteria:
    """Stop when any set criterion is met; ``None`` disables one."""

    reward: float | None = None
    """Stop once ``episode_reward_mean >= reward``."""
    timesteps: int | None = None
    """Stop once ``timesteps_total >= timesteps``."""
    time_s: float | None = None
    """Stop once this invocation has trained for ``time_s`` seconds of wall time."""

    def describe(self) -> str:
        """``"reward >= 450, 600 s"`` style summary (``"none"`` when empty)."""
        parts = []
        if self.reward is not None:
            parts.append(f"episode_reward_mean >= {self.reward:g}")
        if self.timesteps is not None:
            parts.append(f"timesteps_total >= {self.timesteps:,}")
        if self.time_s is not None:
            parts.append(f"{self.time_s:g} s")
        return ", ".join(parts) or "none (stop with Ctrl-C)"

    def reached(self, result: dict[str, Any], elapsed_s: float) -> str | None:
        """The reason to stop after ``result`` (``elapsed_s`` of training), or None."""
        reward = result.get("episode_reward_mean")
        if (self.reward is not None and isinstance(reward, (int, float))
                and not math.isnan(reward) and reward >= self.reward):
            return f"episode_reward_mean {reward:.1f} >= {self.reward:g}"
        timesteps = int(result.get("timesteps_total", 0))
        if self.timesteps is not None and timesteps >= self.timesteps:
            return f"timesteps_total {timesteps:,} >= {self.timesteps:,}"
        if self.time_s is not None and elapsed_s >= self.time_s:
            return f"trained for {elapsed_s:.0f} s >= {self.time_s:g} s"
        return None

    def fraction(self, result: dict[str, Any] | None, elapsed_s: float) -> float:
        """Progress toward the nearest criterion, in [0, 1] (0 when there is none)."""
        fractions = [0.0]
        if self.time_s:
            fractions.append(elapsed_s / self.time_s)
        if result is not None:
            if self.timesteps:
                fractions.append(int(result.get("timesteps_total", 0)) / self.timesteps)
            reward = result.get("episode_reward_mean")
            if (self.reward and self.reward > 0 and isinstance(reward, (int, float))
                    and not math.isnan(reward)):
                fractions.append(max(0.0, reward) / self.reward)
        return min(1.0, max(fractions))

    def eta_s(self, result: dict[str, Any] | None, elapsed_s: float,
              env_steps_per_s: float) -> float | None:
        """Seconds until the time or timesteps criterion at the current pace (None when
        neither is set). A reward criterion may stop training earlier."""
        etas = []
        if self.time_s:
            etas.append(max(0.0, self.time_s - elapsed_s))
        if self.timesteps and result is not None and env_steps_per_s > 0:
            remaining = self.timesteps - int(result.get("timesteps_total", 0))
            etas.append(max(0.0, remaining / env_steps_per_s))
        return min(etas) if etas else None
