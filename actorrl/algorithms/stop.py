"""When training stops: the one set of stop criteria of ``actorrl train``, ``--address``
runs and cluster jobs.

A criterion is a result key (dotted for nested keys: ``info.num_steps_trained``) and a
threshold: training stops once ``result[key] >= threshold``. ``episode_reward_mean`` and
``timesteps_total`` include what a restored checkpoint had already done, as in RLlib.
Besides result keys, ``time_s`` bounds this invocation's wall time since training started,
so a resumed run gets its full time budget.

Standard library only: the command line loads this before anything starts a thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actorrl.config.aliases import resolve_stop_keys

DEFAULT_STOP_TIME_S = 600.0
CARTPOLE_SOLVED_REWARD = 450.0
REWARD_KEY = "episode_reward_mean"
TIMESTEPS_KEY = "timesteps_total"
TIME_TOTAL_KEY = "time_total_s"


def default_stop_reward(env: str) -> float | None:
    """450 for CartPole-v1 (solved), no reward criterion for other envs."""
    return CARTPOLE_SOLVED_REWARD if env == "CartPole-v1" else None


def lookup(result: Mapping[str, Any], key: str) -> Any:
    """``result[key]`` where ``key`` may be dotted (``info.num_steps_trained``); None when
    absent."""
    value: Any = result
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (absent, NaN, not a number, a bool)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _fmt(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.1f}"


@dataclass(frozen=True, kw_only=True)
class StopCriteria:
    """Stop when any criterion is met (see the module docstring); empty: never."""

    thresholds: Mapping[str, float] = field(default_factory=dict)
    """Result key -> stop once the result's value is ``>=`` this."""
    time_s: float | None = None
    """Stop once this invocation has trained for ``time_s`` seconds of wall time."""

    @classmethod
    def of(cls, *, reward: float | None = None, timesteps: int | None = None,
           time_s: float | None = None) -> StopCriteria:
        """The criteria of ``actorrl train``'s ``--stop-*`` flags (None disables one)."""
        thresholds: dict[str, float] = {}
        if reward is not None:
            thresholds[REWARD_KEY] = float(reward)
        if timesteps is not None:
            thresholds[TIMESTEPS_KEY] = int(timesteps)
        return cls(thresholds=thresholds, time_s=time_s)

    @classmethod
    def from_mapping(cls, stop: Mapping[str, Any]) -> StopCriteria:
        """A job's ``"stop"`` mapping (result key -> number; RLlib 2.x's result paths such
        as ``env_runners/episode_return_mean`` read as actorrl's keys, see
        :data:`actorrl.config.aliases.STOP_ALIASES`); ValueError otherwise."""
        if not isinstance(stop, Mapping) or not all(
                isinstance(k, str) and _number(v) is not None for k, v in stop.items()):
            raise ValueError("'stop' must map result keys (e.g. 'training_iteration') to "
                             "numbers")
        return cls(thresholds={k: float(v) for k, v in resolve_stop_keys(stop).items()})

    def to_mapping(self) -> dict[str, float]:
        """The criteria as a job's ``"stop"`` mapping; wall time becomes ``time_total_s``
        (the job's own training time)."""
        out = dict(self.thresholds)
        if self.time_s is not None:
            out[TIME_TOTAL_KEY] = self.time_s
        return out

    @property
    def reward(self) -> float | None:
        """The ``episode_reward_mean`` threshold, if any."""
        return self.thresholds.get(REWARD_KEY)

    @property
    def timesteps(self) -> float | None:
        """The ``timesteps_total`` threshold, if any."""
        return self.thresholds.get(TIMESTEPS_KEY)

    def describe(self) -> str:
        """``"episode_reward_mean >= 450, 600 s"`` style summary."""
        parts = [f"{key} >= {_fmt(threshold)}" for key, threshold in self.thresholds.items()]
        if self.time_s is not None:
            parts.append(f"{self.time_s:g} s")
        return ", ".join(parts) or "none (stop with Ctrl-C)"

    def reached(self, result: Mapping[str, Any], elapsed_s: float) -> str | None:
        """The reason to stop after ``result`` (``elapsed_s`` of training), or None."""
        for key, threshold in self.thresholds.items():
            value = _number(lookup(result, key))
            if value is not None and value >= threshold:
                return f"{key} {_fmt(value)} >= {_fmt(threshold)}"
        if self.time_s is not None and elapsed_s >= self.time_s:
            return f"trained for {elapsed_s:.0f} s >= {self.time_s:g} s"
        return None

    def fraction(self, result: Mapping[str, Any] | None, elapsed_s: float) -> float:
        """Progress toward the nearest criterion, in [0, 1] (0 when there is none); a
        non-positive threshold counts as no progress."""
        fractions = [0.0]
        if self.time_s:
            fractions.append(elapsed_s / self.time_s)
        for key, threshold in self.thresholds.items():
            value = _number(lookup(result, key)) if result is not None else None
            if value is not None and threshold > 0:
                fractions.append(max(0.0, value) / threshold)
        return min(1.0, max(fractions))

    def eta_s(self, result: Mapping[str, Any] | None, elapsed_s: float,
              env_steps_per_s: float) -> float | None:
        """Seconds until the time or timesteps criterion at the current pace (None when
        neither is set). A reward criterion may stop training earlier."""
        etas = []
        if self.time_s:
            etas.append(max(0.0, self.time_s - elapsed_s))
        timesteps = self.timesteps
        if timesteps and result is not None and env_steps_per_s > 0:
            remaining = timesteps - int(result.get(TIMESTEPS_KEY, 0))
            etas.append(max(0.0, remaining / env_steps_per_s))
        return min(etas) if etas else None
