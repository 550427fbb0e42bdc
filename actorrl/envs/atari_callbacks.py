"""Example callbacks for Atari runs (``callbacks: actorrl.envs.atari_callbacks:AtariCallbacks``),
as RLlib users write them: game figures the reward curve does not show, as custom metrics."""

from __future__ import annotations

from typing import Any

from actorrl.callbacks import DefaultCallbacks, Episode
from actorrl.envs.atari import GAME_OVER, GAME_REWARD


class AtariCallbacks(DefaultCallbacks):
    """Per learning episode (one life with ``episodic_life``): ``game_score`` (the
    unclipped score, where learning sees clipped rewards), ``lives`` (ALE's count at the
    end) and ``game_over`` (1 when the game ended, 0 when only a life was lost)."""

    def on_episode_start(self, *, episode: Episode, **kwargs: Any) -> None:
        """Start the score at 0."""
        episode.user_data["game_score"] = 0.0

    def on_episode_step(self, *, episode: Episode, **kwargs: Any) -> None:
        """Add the step's game reward."""
        info = episode.last_info_for()
        episode.user_data["game_score"] += float(info.get(GAME_REWARD,
                                                          episode.last_reward_for()))

    def on_episode_end(self, *, episode: Episode, **kwargs: Any) -> None:
        """Report the episode's figures."""
        info = episode.last_info_for()
        episode.custom_metrics["game_score"] = episode.user_data["game_score"]
        if "lives" in info:
            episode.custom_metrics["lives"] = float(info["lives"])
        episode.custom_metrics["game_over"] = float(bool(info.get(GAME_OVER, True)))
