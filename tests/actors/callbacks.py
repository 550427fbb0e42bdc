"""Callbacks classes the tests name by path (``tests.actors.callbacks:...``)."""

from __future__ import annotations

from typing import Any

from actorrl.callbacks import DefaultCallbacks


class CountingCallbacks(DefaultCallbacks):
    """Records what each hook saw as custom metrics (CartPole: reward 1 per step)."""

    def __init__(self, legacy_callbacks_dict: dict[str, Any] | None = None) -> None:
        super().__init__(legacy_callbacks_dict)
        self.samples_seen = 0

    def on_episode_start(self, *, episode, env_index, **kwargs) -> None:
        assert episode.length == 0 and episode.env_index == env_index
        episode.user_data["rewards"] = 0.0
        episode.user_data["infos"] = 0

    def on_episode_step(self, *, episode, **kwargs) -> None:
        episode.user_data["rewards"] += episode.last_reward_for()
        episode.user_data["infos"] += isinstance(episode.last_info_for(), dict)

    def on_episode_end(self, *, episode, worker, policies, **kwargs) -> None:
        assert "default_policy" in policies and worker.worker_index >= 1
        episode.custom_metrics["length_seen"] = episode.length
        episode.custom_metrics["reward_minus_length"] = (episode.user_data["rewards"]
                                                         - episode.length)
        episode.custom_metrics["infos_minus_length"] = (episode.user_data["infos"]
                                                        - episode.length)
        episode.custom_metrics["samples_before"] = self.samples_seen

    def on_sample_end(self, *, worker, samples, **kwargs) -> None:
        assert samples.count > 0
        self.samples_seen += 1

    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        result["callback_saw_iteration"] = result["training_iteration"]


class EpisodeLengthCallbacks(DefaultCallbacks):
    """Reports each episode's length as the custom metric ``length_seen`` (from any
    worker, the learner's local worker included)."""

    def on_episode_end(self, *, episode, **kwargs) -> None:
        episode.custom_metrics["length_seen"] = episode.length


class RaisingCallbacks(DefaultCallbacks):
    """Fails at the end of the first episode."""

    def on_episode_end(self, **kwargs) -> None:
        raise RuntimeError("callback exploded on purpose")


class NotCallbacks:
    """Not a DefaultCallbacks subclass."""
