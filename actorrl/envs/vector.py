"""Vectorized envs inside one worker: :class:`VectorEnv` (single-agent) and
:class:`MultiAgentVectorEnv` step their envs in the calling thread and reset finished ones
by hand (see :mod:`actorrl.envs`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from actorrl.data.spaces import observation_preprocessor
from actorrl.envs.atari import GAME_OVER, GAME_REWARD
from actorrl.envs.episodes import EpisodeMetrics
from actorrl.envs.make import ALL_AGENTS, EnvSpec, MultiAgentEnv, make_env
from actorrl.envs.video import record_episodes, rgb_array_config

SEED_STRIDE_PER_WORKER = 1000


# ---- vectorized single-agent envs -------------------------------------------------------

@dataclass
class VectorStep:
    """One step of every env in a :class:`VectorEnv` (arrays have ``num_envs`` rows).

    ``next_obs`` is what each env returned (the final observation where the episode ended;
    bootstrap from it on truncation). ``obs`` is what to act on next: ``next_obs``, with the
    first observation of the new episode in the rows where one ended.
    """

    next_obs: np.ndarray
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    obs: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)
    """Each env's ``info`` of this step (for callbacks' ``episode.last_info_for()``)."""

    @property
    def dones(self) -> np.ndarray:
        """Rows whose episode ended this step (terminated or truncated)."""
        return self.terminateds | self.truncateds


class _EnvSet:
    """What both vector envs share: their envs and the episode metrics they gather."""

    envs: list[Any]
    metrics: EpisodeMetrics

    def pop_metrics(self) -> EpisodeMetrics:
        """Episodes finished since the last call."""
        metrics, self.metrics = self.metrics, EpisodeMetrics()
        return metrics

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


class VectorEnv(_EnvSet):
    """``num_envs`` single-agent gymnasium envs stepped in a loop, reset by hand.

    Records each finished episode's reward and length in :attr:`metrics`.
    """

    def __init__(self, envs: Sequence[gym.Env], *, seed: int | None = None,
                 worker_index: int = 0) -> None:
        if not envs:
            raise ValueError("VectorEnv needs at least one env")
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._discrete_actions = isinstance(self.action_space, gym.spaces.Discrete)
        # Dict/Tuple/... observations become flat float32 vectors (actorrl.data.spaces)
        self._preprocess = observation_preprocessor(self.observation_space)
        self._seeds = _env_seeds(seed, worker_index, self.num_envs)
        self._episode_rewards = [0.0] * self.num_envs
        self._episode_lengths = [0] * self.num_envs
        self.metrics = EpisodeMetrics()

    def reset(self) -> np.ndarray:
        """Reset every env (seeding each on its first reset); the stacked observations."""
        obs = []
        for i, env in enumerate(self.envs):
            seed = self._seeds[i]
            self._seeds[i] = None
            if seed is not None:
                env.action_space.seed(seed)
            obs.append(self._prep(env.reset(seed=seed)[0]))
            self._episode_rewards[i] = 0.0
            self._episode_lengths[i] = 0
        return np.stack(obs)

    def _prep(self, obs: Any) -> Any:
        return obs if self._preprocess is None else self._preprocess(obs)

    def step(self, actions: np.ndarray | Sequence[Any]) -> VectorStep:
        """Step env ``i`` with ``actions[i]``; reset the envs whose episode ended."""
        discrete_array = self._discrete_actions and isinstance(actions, np.ndarray)
        acts = actions.tolist() if discrete_array else actions
        next_obs, rewards, terms, truncs, infos = [], [], [], [], []
        obs = None
        for i, env in enumerate(self.envs):
            o, r, term, trunc, info = env.step(acts[i])
            o = self._prep(o)
            infos.append(info)
            next_obs.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            # Atari wrappers report game scores and real game ends beside what learning sees
            self._episode_rewards[i] += float(info.get(GAME_REWARD, r))
            self._episode_lengths[i] += 1
            if term or trunc:
                if obs is None:
                    obs = list(next_obs[:i])
                if info.get(GAME_OVER, True):
                    self.metrics.record(self._episode_rewards[i], self._episode_lengths[i])
                    self._episode_rewards[i] = 0.0
                    self._episode_lengths[i] = 0
                o = self._prep(env.reset()[0])
            if obs is not None:
                obs.append(o)
        next_obs_arr = np.stack(next_obs)
        return VectorStep(
            next_obs=next_obs_arr,
            rewards=np.asarray(rewards, dtype=np.float32),
            terminateds=np.asarray(terms, dtype=bool),
            truncateds=np.asarray(truncs, dtype=bool),
            obs=next_obs_arr if obs is None else np.stack(obs),
            infos=infos,
        )


def _env_seeds(seed: int | None, worker_index: int, num_envs: int) -> list[int | None]:
    if seed is None:
        return [None] * num_envs
    base = int(seed) + SEED_STRIDE_PER_WORKER * worker_index
    return [base + i for i in range(num_envs)]


# ---- vectorized multi-agent envs --------------------------------------------------------

@dataclass
class MultiAgentStep:
    """One step of one :class:`MultiAgentEnv` in a :class:`MultiAgentVectorEnv`.

    The dicts are what the env returned (flags always hold ``"__all__"``). ``reset_obs``
    is the first observation dict of the next episode when this step ended the episode,
    else ``None``.
    """

    obs: dict[str, Any]
    rewards: dict[str, float]
    terminateds: dict[str, bool]
    truncateds: dict[str, bool]
    reset_obs: dict[str, Any] | None

    @property
    def episode_done(self) -> bool:
        """Whether the whole episode ended this step."""
        return bool(self.terminateds[ALL_AGENTS] or self.truncateds[ALL_AGENTS])


class MultiAgentVectorEnv(_EnvSet):
    """``num_envs`` :class:`MultiAgentEnv` stepped in a loop, reset by hand when
    ``"__all__"`` ends an episode. An episode's reward is the sum over all agents; each
    agent's own total is recorded with the policy ``policy_of(env_index, agent_id)`` names
    (set by the sampler, which maps agents to policies; agents it names none for are left
    out of the per-policy rewards)."""

    def __init__(self, envs: Sequence[MultiAgentEnv], *, seed: int | None = None,
                 worker_index: int = 0) -> None:
        if not envs:
            raise ValueError("MultiAgentVectorEnv needs at least one env")
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        self.possible_agents = list(self.envs[0].possible_agents)
        self.observation_spaces = dict(self.envs[0].observation_spaces)
        self.action_spaces = dict(self.envs[0].action_spaces)
        self._preprocessors = {agent: prep for agent, space in self.observation_spaces.items()
                               if (prep := observation_preprocessor(space)) is not None}
        self._seeds = _env_seeds(seed, worker_index, self.num_envs)
        self._episode_rewards = [0.0] * self.num_envs
        self._episode_lengths = [0] * self.num_envs
        self._agent_rewards: list[dict[str, float]] = [{} for _ in range(self.num_envs)]
        self.policy_of: Callable[[int, str], str | None] = lambda _i, _agent: None
        self.metrics = EpisodeMetrics()

    def reset(self) -> list[dict[str, Any]]:
        """Reset every env (seeding each on its first reset); per-env observation dicts."""
        out = []
        for i, env in enumerate(self.envs):
            seed = self._seeds[i]
            self._seeds[i] = None
            out.append(self._prep(env.reset(seed=seed)[0]))
            self._episode_rewards[i] = 0.0
            self._episode_lengths[i] = 0
            self._agent_rewards[i] = {}
        return out

    def step(self, actions: Sequence[dict[str, Any]]) -> list[MultiAgentStep]:
        """Step env ``i`` with ``actions[i]``; reset the envs whose episode ended."""
        out = []
        for i, env in enumerate(self.envs):
            obs, rewards, terms, truncs, _ = env.step(actions[i])
            if ALL_AGENTS not in terms or ALL_AGENTS not in truncs:
                raise ValueError(f"{type(env).__name__}.step must return terminateds and "
                                 f"truncateds dicts with an {ALL_AGENTS!r} key")
            self._episode_rewards[i] += float(sum(rewards.values()))
            self._episode_lengths[i] += 1
            agent_rewards = self._agent_rewards[i]
            for agent_id, reward in rewards.items():
                agent_rewards[agent_id] = agent_rewards.get(agent_id, 0.0) + float(reward)
            step = MultiAgentStep(self._prep(obs), dict(rewards), dict(terms), dict(truncs),
                                  None)
            if step.episode_done:
                by_policy = [(pid, reward) for agent_id, reward in agent_rewards.items()
                             if (pid := self.policy_of(i, agent_id)) is not None]
                self.metrics.record(self._episode_rewards[i], self._episode_lengths[i],
                                    by_policy)
                self._episode_rewards[i] = 0.0
                self._episode_lengths[i] = 0
                self._agent_rewards[i] = {}
                step.reset_obs = self._prep(env.reset()[0])
            out.append(step)
        return out

    def _prep(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """Agents' observations, flattened where their space needs it."""
        if not self._preprocessors:
            return dict(obs)
        return {agent: (self._preprocessors[agent](o) if agent in self._preprocessors else o)
                for agent, o in obs.items()}


def make_vector_env(spec: EnvSpec, env_config: Mapping[str, Any] | None = None, *,
                    num_envs: int = 1, worker_index: int = 0, num_workers: int = 0,
                    seed: int | None = None, horizon: int | None = None,
                    record_video: str | None = None) -> VectorEnv | MultiAgentVectorEnv:
    """``num_envs`` envs from ``spec`` as a :class:`VectorEnv`, or a
    :class:`MultiAgentVectorEnv` when the spec makes :class:`MultiAgentEnv` instances.
    ``horizon`` (RLlib's): single-agent episodes are cut (truncated) after that many
    steps, as gymnasium's ``TimeLimit`` cuts them. ``record_video``: a folder where every
    episode of env ``i`` is written as ``worker<worker_index>-env<i>-episode-<k>.mp4``
    (the envs render ``rgb_array``; see :mod:`actorrl.envs.video`)."""
    if num_envs < 1:
        raise ValueError(f"num_envs_per_worker must be >= 1, got {num_envs}")
    if record_video is not None:
        env_config = rgb_array_config(env_config)
    envs = [make_env(spec, env_config, worker_index=worker_index, vector_index=i,
                     num_workers=num_workers) for i in range(num_envs)]
    if record_video is not None:
        try:
            envs = [record_episodes(e, record_video, f"worker{worker_index}-env{i}", spec)
                    for i, e in enumerate(envs)]
        except ValueError:
            for e in envs:
                e.close()
            raise
    if horizon is not None:
        if any(isinstance(e, MultiAgentEnv) for e in envs):
            raise ValueError(f"horizon={horizon} cuts single-agent episodes; env {spec!r} is "
                             "multi-agent: end its episodes in the env, or drop horizon")
        envs = [gym.wrappers.TimeLimit(e, max_episode_steps=horizon) for e in envs]
    if all(isinstance(e, MultiAgentEnv) for e in envs):
        return MultiAgentVectorEnv(envs, seed=seed, worker_index=worker_index)
    if any(isinstance(e, MultiAgentEnv) for e in envs):
        raise ValueError(f"env {spec!r} made a mix of single- and multi-agent envs")
    return VectorEnv(envs, seed=seed, worker_index=worker_index)
