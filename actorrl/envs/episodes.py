"""Episode metrics: every finished episode's reward and length (:class:`EpisodeMetrics`,
merged exactly across workers) and RLlib's smoothed result keys over a window of them
(:class:`EpisodeWindow`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transport.codec import register_type


@dataclass
class EpisodeMetrics:
    """Finished episodes' total rewards and lengths (env steps), in finishing order.

    Carries the raw values, so metrics of several workers merge exactly
    (:meth:`merge`); :meth:`summary` gives RLlib's result keys. Multi-agent episodes also
    carry each agent's total reward with the policy that agent acted with
    (``policy_rewards[i]``: ``[[policy_id, reward], ...]``, empty for single-agent ones),
    summarized per policy as RLlib's ``policy_reward_mean/min/max``.
    """

    episode_rewards: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    policy_rewards: list[list[list[Any]]] = field(default_factory=list)

    def record(self, reward: float, length: int,
               policy_rewards: Iterable[tuple[str, float]] = ()) -> None:
        """Add one finished episode (with its agents' ``(policy_id, reward)``)."""
        self.episode_rewards.append(float(reward))
        self.episode_lengths.append(int(length))
        self.policy_rewards.append([[str(pid), float(r)] for pid, r in policy_rewards])

    @property
    def num_episodes(self) -> int:
        """How many episodes are recorded."""
        return len(self.episode_rewards)

    @classmethod
    def merge(cls, metrics: Iterable[EpisodeMetrics]) -> EpisodeMetrics:
        """All episodes of ``metrics`` in one object (given order, then finishing order)."""
        out = cls()
        for m in metrics:
            out.episode_rewards.extend(m.episode_rewards)
            out.episode_lengths.extend(m.episode_lengths)
            out.policy_rewards.extend(m._policy_rewards_per_episode())
        return out

    def _policy_rewards_per_episode(self) -> list[list[list[Any]]]:
        """``policy_rewards``, one (possibly empty) entry per episode."""
        missing = self.num_episodes - len(self.policy_rewards)
        return list(self.policy_rewards) + [[] for _ in range(max(missing, 0))]

    def summary(self) -> dict[str, Any]:
        """``episode_reward_mean/min/max``, ``episode_len_mean`` (NaN without episodes),
        ``episodes_this_iter`` and ``policy_reward_mean/min/max`` over all recorded
        episodes."""
        return _summarize(self.episode_rewards, self.episode_lengths,
                          self._policy_rewards_per_episode(), self.num_episodes)


def _summarize(rewards: Sequence[float], lengths: Sequence[int],
               policy_rewards: Sequence[Sequence[Sequence[Any]]], new_episodes: int
               ) -> dict[str, Any]:
    per_policy: dict[str, list[float]] = {}
    for episode in policy_rewards:
        for pid, reward in episode:
            per_policy.setdefault(str(pid), []).append(float(reward))
    by_policy = {
        "policy_reward_mean": {pid: float(np.mean(r)) for pid, r in per_policy.items()},
        "policy_reward_min": {pid: float(np.min(r)) for pid, r in per_policy.items()},
        "policy_reward_max": {pid: float(np.max(r)) for pid, r in per_policy.items()},
    }
    if rewards:
        return {
            "episode_reward_mean": float(np.mean(rewards)),
            "episode_reward_min": float(np.min(rewards)),
            "episode_reward_max": float(np.max(rewards)),
            "episode_len_mean": float(np.mean(lengths)),
            "episodes_this_iter": new_episodes,
            **by_policy,
        }
    nan = math.nan
    return {"episode_reward_mean": nan, "episode_reward_min": nan, "episode_reward_max": nan,
            "episode_len_mean": nan, "episodes_this_iter": new_episodes, **by_policy}


class EpisodeWindow:
    """Smooths episode stats over iterations like RLlib's ``metrics_smoothing_episodes``.

    Each :meth:`update` takes the episodes finished since the last one (already merged over
    workers). The summary covers all of them, topped up with the most recent earlier
    episodes until ``smoothing_episodes`` are covered; ``episodes_this_iter`` counts only
    the new ones.
    """

    def __init__(self, smoothing_episodes: int = 100) -> None:
        if smoothing_episodes < 1:
            raise ValueError(f"metrics_smoothing_episodes must be >= 1, got {smoothing_episodes}")
        self.smoothing_episodes = smoothing_episodes
        self._rewards: deque[float] = deque(maxlen=smoothing_episodes)
        self._lengths: deque[int] = deque(maxlen=smoothing_episodes)
        self._policy_rewards: deque[list[list[Any]]] = deque(maxlen=smoothing_episodes)

    def update(self, new: EpisodeMetrics) -> dict[str, Any]:
        """Add the new episodes and return the smoothed summary."""
        missing = max(self.smoothing_episodes - new.num_episodes, 0)

        def recent(values: deque) -> list:
            return list(values)[max(len(values) - missing, 0):] if missing else []

        new_policy_rewards = new._policy_rewards_per_episode()
        summary = _summarize(recent(self._rewards) + new.episode_rewards,
                             recent(self._lengths) + new.episode_lengths,
                             recent(self._policy_rewards) + new_policy_rewards,
                             new.num_episodes)
        self._rewards.extend(new.episode_rewards)
        self._lengths.extend(new.episode_lengths)
        self._policy_rewards.extend(new_policy_rewards)
        return summary


register_type(
    EpisodeMetrics,
    "actorrl.EpisodeMetrics",
    lambda m: [m.episode_rewards, m.episode_lengths, m.policy_rewards],
    lambda state: EpisodeMetrics(list(state[0]), list(state[1]),
                                 [list(e) for e in state[2]] if len(state) > 2 else []),
)

