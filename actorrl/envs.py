"""Environments: creation from a spec, vectorization inside a worker, episode metrics.

Env specs
    A gymnasium id (``"CartPole-v1"``), a ``"pkg.module:factory"`` path, or a callable.
    A factory is called with an :class:`EnvContext` (the ``env_config`` dict plus
    ``worker_index``, ``vector_index``, ``num_workers``); a gymnasium id gets ``env_config``
    as keyword arguments of ``gymnasium.make``. gymnasium's own ``"module:EnvId"`` form also
    works (the module is imported, then the id made). actorrl ships
    ``actorrl/StatelessCartPole-v1`` (:mod:`actorrl.partial_envs`), a partially observed
    CartPole for recurrent policies.

Vectorization
    :class:`VectorEnv` holds ``num_envs`` single-agent envs and steps them one after the
    other in the calling thread. An env whose episode ends (``terminated`` or ``truncated``)
    is reset at once by hand (gymnasium's vector autoreset is not used), so every step
    returns both the final observation of the finished episode (for bootstrapping) and the
    first observation of the next one (to act on). :class:`MultiAgentVectorEnv` does the
    same for :class:`MultiAgentEnv`. Env ``i`` of worker ``w`` is seeded once, at its first
    reset, with ``seed + 1000 * w + i``.

Multi-agent protocol (:class:`MultiAgentEnv`)
    ``reset(seed=None, options=None) -> (obs, infos)`` and
    ``step(actions) -> (obs, rewards, terminateds, truncateds, infos)``, every value a dict
    keyed by agent id. An agent acts in a step exactly when it is a key of the last
    returned ``obs``. ``terminateds`` and ``truncateds`` also carry ``"__all__"``, which
    ends the episode for everybody. An agent whose own flag is set is done for the rest of
    the episode. Rewards are credited to the agent's last action and summed until the agent
    next observes (turn-based games work); rewards before an agent's first action are
    counted in the episode total only. When an agent is done or the episode ends, the
    env should include the agent's final observation in ``obs``; if it does not, the
    agent's last observation stands in. ``possible_agents``, ``observation_spaces`` and
    ``action_spaces`` describe the agents (used to infer policy spaces).

Episode metrics
    Envs record every finished episode's total reward and length in an
    :class:`EpisodeMetrics` (raw lists, so several workers' metrics merge exactly);
    :class:`EpisodeWindow` turns a stream of them into RLlib's smoothed result keys.
"""

from __future__ import annotations

import difflib
import importlib
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from actorrl.atari import (
    GAME_OVER,
    GAME_REWARD,
    INSTALL_HINT,
    is_atari_id,
    make_atari,
    register_ale,
)
from actorrl.classpath import resolve_callable
from actorrl.partial_envs import register_partial_envs
from actorrl.spaces import observation_preprocessor
from transport.codec import register_type

register_partial_envs()

ALL_AGENTS = "__all__"
SEED_STRIDE_PER_WORKER = 1000


class EnvContext(dict):
    """The ``env_config`` dict handed to env factories, plus where the env runs.

    ``worker_index`` is 0 for the local worker and 1..N for remote ones; ``vector_index``
    is the env's index inside its worker's vector; ``num_workers`` counts remote workers.
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None, *, worker_index: int = 0,
                 vector_index: int = 0, num_workers: int = 0) -> None:
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.num_workers = num_workers


EnvSpec = str | Callable[[EnvContext], Any]
"""A gymnasium id, a ``"pkg.module:factory"`` path, or a factory callable."""


class MultiAgentEnv:
    """Base class of multi-agent envs; see the module docstring for the protocol.

    Subclasses set ``possible_agents`` (agent ids), ``observation_spaces`` and
    ``action_spaces`` (agent id -> space) and implement :meth:`reset` and :meth:`step`.
    """

    possible_agents: list[str] = []
    observation_spaces: dict[str, gym.Space] = {}
    action_spaces: dict[str, gym.Space] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: observations of the agents that act first, and infos."""
        raise NotImplementedError

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per acting agent: ``(obs, rewards, terminateds, truncateds,
        infos)`` keyed by agent id; the flag dicts also hold ``"__all__"``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (nothing by default)."""


def make_env(spec: EnvSpec, env_config: Mapping[str, Any] | None = None, *,
             worker_index: int = 0, vector_index: int = 0, num_workers: int = 0) -> Any:
    """Build one env (``gym.Env`` or :class:`MultiAgentEnv`) from ``spec``.

    Raises ``ValueError`` naming the problem: an unknown gymnasium id (with close matches
    from gymnasium's registry), a bad ``"pkg.module:factory"`` path, or a factory that
    returned something that is not an env.
    """
    context = EnvContext(env_config, worker_index=worker_index, vector_index=vector_index,
                         num_workers=num_workers)
    if callable(spec):
        return _check_env(spec(context), spec)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"env must be a gymnasium id, a 'pkg.module:factory' path or a "
                         f"callable, got {spec!r}")
    if ":" in spec:
        module_name, _, name = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ValueError(f"env {spec!r}: cannot import module {module_name!r} ({exc})"
                             ) from exc
        if not hasattr(module, name) and name in gym.envs.registry:
            return gym.make(name, **dict(env_config or {}))  # gymnasium's "module:EnvId"
        factory = resolve_callable(spec, "env factory")
        return _check_env(factory(context), spec)
    if spec not in gym.envs.registry and spec.startswith("ALE/") and not register_ale():
        raise ValueError(f"env {spec!r} is an Atari game and needs ale-py, which is not "
                         f"installed: {INSTALL_HINT}")
    if is_atari_id(spec):
        return make_atari(spec, dict(env_config or {}))
    if spec.startswith("MinAtar/") and spec not in gym.envs.registry:
        register_minatar()
    if spec not in gym.envs.registry:
        close = difflib.get_close_matches(spec, list(gym.envs.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown environment id {spec!r} (not in gymnasium's registry, and "
                         f"not a 'pkg.module:factory' path){hint}")
    return gym.make(spec, **dict(env_config or {}))


MINATAR_HINT = "pip install -e '.[minatar]' (or pip install minatar)"


def register_minatar() -> None:
    """Register the MinAtar games (``MinAtar/Breakout-v0`` ..., ``-v1`` with the minimal
    action set) with gymnasium; ``ValueError`` naming the extra when ``minatar`` is not
    installed."""
    try:
        from minatar.gym import register_envs
    except ImportError:
        raise ValueError(f"MinAtar ids need the minatar package, which is not installed: "
                         f"{MINATAR_HINT}") from None
    if not any(name.startswith("MinAtar/") for name in gym.envs.registry):
        register_envs()
    # -v0 is chosen on purpose (the full action set the MinAtar paper's agents used), so
    # gymnasium's "out of date, -v1 exists" warning on every make is noise.
    warnings.filterwarnings("ignore", message=r".*MinAtar/\S+-v0 is out of date",
                            category=DeprecationWarning)


def _check_env(env: Any, spec: Any) -> Any:
    if isinstance(env, (gym.Env, MultiAgentEnv)):
        return env
    raise ValueError(f"env factory {spec!r} returned {type(env).__name__}, expected a "
                     f"gymnasium.Env or an actorrl.envs.MultiAgentEnv")


# ---- episode metrics ------------------------------------------------------------------

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
            return list(values)[len(values) - missing:] if missing else []

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
        # Dict/Tuple/... observations become flat float32 vectors (actorrl.spaces)
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
                    seed: int | None = None) -> VectorEnv | MultiAgentVectorEnv:
    """``num_envs`` envs from ``spec`` as a :class:`VectorEnv`, or a
    :class:`MultiAgentVectorEnv` when the spec makes :class:`MultiAgentEnv` instances."""
    if num_envs < 1:
        raise ValueError(f"num_envs_per_worker must be >= 1, got {num_envs}")
    envs = [make_env(spec, env_config, worker_index=worker_index, vector_index=i,
                     num_workers=num_workers) for i in range(num_envs)]
    if all(isinstance(e, MultiAgentEnv) for e in envs):
        return MultiAgentVectorEnv(envs, seed=seed, worker_index=worker_index)
    if any(isinstance(e, MultiAgentEnv) for e in envs):
        raise ValueError(f"env {spec!r} made a mix of single- and multi-agent envs")
    return VectorEnv(envs, seed=seed, worker_index=worker_index)
