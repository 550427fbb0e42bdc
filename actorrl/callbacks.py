"""User callbacks (RLlib's ``callbacks`` config key) and custom episode metrics.

A config names a subclass of :class:`DefaultCallbacks` as ``"pkg.module:MyCallbacks"``.
Each rollout worker builds one instance and calls the episode and sample hooks in its own
process, where the episodes are; the driver builds another and calls
:meth:`DefaultCallbacks.on_train_result` with each result. Hooks take keyword arguments
only, as RLlib's, so a hook may accept ``**kwargs`` and ignore what it does not use.

Whatever an episode's hooks put in ``episode.custom_metrics`` is collected when the
episode ends and aggregated into the result's ``custom_metrics`` as RLlib does:
``<name>_mean``, ``<name>_min`` and ``<name>_max`` over the same smoothing window as
``episode_reward_mean`` (``metrics_smoothing_episodes``); NaN values are left out.

A hook that raises fails the sample (or the iteration) it ran in, and with it the run:
the error, with its traceback, is what ``actorrl train`` reports.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from actorrl.util.classpath import resolve

DEFAULT_CALLBACKS = "actorrl.callbacks:DefaultCallbacks"


class Episode:
    """One env's running episode as the episode hooks see it (RLlib's ``Episode``).

    ``length``: env steps so far; ``total_reward``: their summed (learning) reward;
    ``user_data``: free scratch space kept for the episode; ``custom_metrics``: floats
    to report (collected at the end); ``hist_data``: lists of values (kept per episode,
    not aggregated); ``env_index``: which of the worker's envs runs it."""

    def __init__(self, episode_id: int, env_index: int) -> None:
        self.episode_id = episode_id
        self.env_index = env_index
        self.length = 0
        self.total_reward = 0.0
        self.user_data: dict[str, Any] = {}
        self.custom_metrics: dict[str, float] = {}
        self.hist_data: dict[str, list[Any]] = {}
        self._last_info: dict[str, Any] = {}
        self._last_reward = 0.0
        self._last_action: Any = None

    def step(self, reward: float, info: Mapping[str, Any] | None, action: Any) -> None:
        """Account one env step (the sampler calls it before ``on_episode_step``)."""
        self.length += 1
        self.total_reward += float(reward)
        self._last_reward = float(reward)
        self._last_info = dict(info or {})
        self._last_action = action

    def last_info_for(self, agent_id: Any = None) -> dict[str, Any]:
        """The env's ``info`` of the last step (``{}`` before the first)."""
        return self._last_info

    def last_reward_for(self, agent_id: Any = None) -> float:
        """The reward of the last step."""
        return self._last_reward

    def last_action_for(self, agent_id: Any = None) -> Any:
        """The action taken at the last step (``None`` before the first)."""
        return self._last_action


class DefaultCallbacks:
    """Base class of user callbacks: every hook does nothing. Override the ones you need;
    ``legacy_callbacks_dict`` is accepted for RLlib compatibility and ignored."""

    def __init__(self, legacy_callbacks_dict: dict[str, Any] | None = None) -> None:
        self.legacy_callbacks_dict = legacy_callbacks_dict

    def on_episode_start(self, *, worker: Any, base_env: Any, policies: Mapping[str, Any],
                         episode: Episode, env_index: int, **kwargs: Any) -> None:
        """A new episode began on env ``env_index`` of ``worker`` (a rollout worker)."""

    def on_episode_step(self, *, worker: Any, base_env: Any, policies: Mapping[str, Any],
                        episode: Episode, env_index: int, **kwargs: Any) -> None:
        """The episode took one step (``episode.length`` counts it)."""

    def on_episode_end(self, *, worker: Any, base_env: Any, policies: Mapping[str, Any],
                       episode: Episode, env_index: int, **kwargs: Any) -> None:
        """The episode ended (terminated or truncated); ``episode.custom_metrics`` is
        collected after this hook."""

    def on_sample_end(self, *, worker: Any, samples: Any, **kwargs: Any) -> None:
        """``worker`` collected ``samples`` (a SampleBatch or MultiAgentBatch), before it
        leaves the worker; may modify it in place."""

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any
                        ) -> None:
        """A training iteration's ``result`` on the driver (``algorithm`` and ``trainer``:
        the Trainer), before it is reported; may add keys to it."""


def load_callbacks_class(path: str | None) -> type[DefaultCallbacks]:
    """The callbacks class at ``"pkg.module:Class"`` (``None``: :class:`DefaultCallbacks`);
    ``ValueError`` when it does not import or is no :class:`DefaultCallbacks` subclass."""
    if path is None:
        return DefaultCallbacks
    cls = resolve(path, "callbacks")
    if not (isinstance(cls, type) and issubclass(cls, DefaultCallbacks)):
        raise ValueError(f"callbacks {path!r} must be a subclass of "
                         f"actorrl.callbacks.DefaultCallbacks, got {cls!r}")
    return cls


def check_callbacks(path: str | None) -> list[str]:
    """Config problems with the ``callbacks`` key (empty when it loads)."""
    try:
        load_callbacks_class(path)
    except ValueError as exc:
        return [str(exc)]
    return []


def make_callbacks(path: str | None) -> DefaultCallbacks:
    """An instance of the configured callbacks class."""
    return load_callbacks_class(path)()


def summarize_custom_metrics(episodes: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """RLlib's aggregation: ``<name>_mean/_min/_max`` over the episodes that reported
    ``name``, NaN values left out (all NaN: ``_mean`` NaN, ``_min``/``_max`` NaN)."""
    values: dict[str, list[float]] = {}
    for metrics in episodes:
        for name, value in metrics.items():
            values.setdefault(str(name), []).append(float(value))
    out: dict[str, float] = {}
    for name, raw in values.items():
        kept = [v for v in raw if not math.isnan(v)]
        out[f"{name}_mean"] = sum(kept) / len(kept) if kept else math.nan
        out[f"{name}_min"] = min(kept) if kept else math.nan
        out[f"{name}_max"] = max(kept) if kept else math.nan
    return out


class CustomMetricsWindow:
    """Per-episode custom metrics smoothed as ``episode_reward_mean`` is: each
    :meth:`update` covers the new episodes topped up with the latest earlier ones up to
    ``smoothing_episodes``."""

    def __init__(self, smoothing_episodes: int = 100) -> None:
        self.smoothing_episodes = smoothing_episodes
        self._episodes: deque[dict[str, float]] = deque(maxlen=smoothing_episodes)

    def update(self, new: list[dict[str, float]]) -> dict[str, float]:
        """Add the new episodes' metrics; the aggregated ``custom_metrics`` section."""
        missing = max(self.smoothing_episodes - len(new), 0)
        old = list(self._episodes)[len(self._episodes) - missing:] if missing else []
        self._episodes.extend(new)
        return summarize_custom_metrics(old + list(new))


class EpisodeTracker:
    """Runs the episode hooks for a worker's vectorized envs: one :class:`Episode` per
    env, started, stepped and ended as the sampler steps them; keeps each ended
    episode's ``custom_metrics`` until :meth:`pop_custom_metrics`."""

    def __init__(self, callbacks: DefaultCallbacks, worker: Any, base_env: Any,
                 policies: Mapping[str, Any]) -> None:
        self.callbacks = callbacks
        self.context = {"worker": worker, "base_env": base_env, "policies": policies}
        self.episodes: dict[int, Episode] = {}
        self.custom_metrics: list[dict[str, float]] = []

    def start(self, env_index: int, episode_id: int) -> None:
        """A new episode on env ``env_index``: ``on_episode_start``."""
        episode = Episode(int(episode_id), env_index)
        self.episodes[env_index] = episode
        self.callbacks.on_episode_start(**self.context, episode=episode, env_index=env_index)

    def step(self, rewards: Any, infos: list[dict[str, Any]], actions: Any, dones: Any,
             next_episode_ids: Any) -> None:
        """One step of every env: ``on_episode_step`` each, then ``on_episode_end`` and a
        fresh episode where ``dones``."""
        for i, episode in sorted(self.episodes.items()):
            episode.step(rewards[i], infos[i] if i < len(infos) else None, actions[i])
            self.callbacks.on_episode_step(**self.context, episode=episode, env_index=i)
            if dones[i]:
                self.callbacks.on_episode_end(**self.context, episode=episode, env_index=i)
                self.custom_metrics.append(dict(episode.custom_metrics))
                self.start(i, next_episode_ids[i])

    def pop_custom_metrics(self) -> list[dict[str, float]]:
        """The ended episodes' custom metrics since the last call."""
        out, self.custom_metrics = self.custom_metrics, []
        return out
