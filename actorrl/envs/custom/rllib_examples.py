"""RLlib's example envs that its tuned files name, as gymnasium envs that behave the same.

RLlib's files name these by class path (``ray.rllib.examples.env.random_env.RandomEnv``);
:data:`actorrl.config.aliases.RLLIB_CLASSES` reads those paths as the classes here. Each
takes the ``env_config`` RLlib's took, with RLlib's defaults, directly or in the form RLlib's
files write it (``env_config: {config: {...}}``, see :func:`constructor_config`).

- :class:`RandomEnv`: observations and rewards sampled from their spaces, an episode ending
  with probability ``p_terminated`` (RLlib's older ``p_done``) at every step, or after
  ``max_episode_len`` steps; :class:`RandomLargeObsSpaceEnv` is it with 5000-float
  observations (RLlib's memory-leak tests).
- :class:`RepeatAfterMeEnv`: the agent is paid +1 for repeating the observation of
  ``repeat_delay`` steps ago (-1 otherwise; with ``continuous``, minus the absolute
  difference), 100-step episodes: a memory test for recurrent policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np


def constructor_config(env_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``config`` argument RLlib gives one of its example env classes for this
    ``env_config``. RLlib builds a class-path env with ``from_config(path, env_config)``:
    ``env_config``'s keys are the constructor's keyword arguments, so its files write
    ``env_config: {config: {num_agents: 4}}`` for ``MultiAgentCartPole(config={...})``.
    That form (one ``config`` key holding a mapping) gives the inner mapping; any other
    ``env_config`` (actorrl's own files) is the config itself."""
    config = dict(env_config or {})
    if set(config) == {"config"} and isinstance(config["config"], Mapping):
        return dict(config["config"])
    return config


class RandomEnv(gym.Env):
    """RLlib's ``RandomEnv``: see the module docstring. ``env_config`` keys:
    ``action_space``, ``observation_space`` (``Discrete(2)`` each), ``reward_space``
    (``Box(-1, 1, ())``), ``p_terminated`` / ``p_done`` (0.1), ``max_episode_len``
    (None), ``check_action_bounds`` (False)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = constructor_config(config)
        self.action_space = config.get("action_space", gym.spaces.Discrete(2))
        self.observation_space = config.get("observation_space", gym.spaces.Discrete(2))
        self.reward_space = config.get(
            "reward_space", gym.spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32))
        self.p_terminated = float(config.get("p_terminated", config.get("p_done", 0.1)))
        self.max_episode_len = config.get("max_episode_len")
        self.check_action_bounds = bool(config.get("check_action_bounds", False))
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[Any, dict]:
        """A sampled first observation (the spaces are seeded with ``seed``)."""
        super().reset(seed=seed)
        if seed is not None:
            for i, space in enumerate((self.observation_space, self.reward_space)):
                space.seed(seed + i)
        self.steps = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """A sampled observation and reward; the end of the episode by chance or length."""
        if self.check_action_bounds and not self.action_space.contains(action):
            raise ValueError(f"illegal action for {self.action_space}: {action!r}")
        self.steps += 1
        terminated = bool(self.np_random.random() < self.p_terminated)
        truncated = not terminated and self.max_episode_len is not None and \
            self.steps >= self.max_episode_len
        return (self.observation_space.sample(), float(self.reward_space.sample()),
                terminated, truncated, {})


class RandomLargeObsSpaceEnv(RandomEnv):
    """:class:`RandomEnv` with ``Box(-1, 1, (5000,))`` observations (RLlib's memory-leak
    tests)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__({**constructor_config(config), "observation_space": gym.spaces.Box(
            -1.0, 1.0, (5000,), dtype=np.float32)})


class RepeatAfterMeEnv(gym.Env):
    """RLlib's ``RepeatAfterMeEnv``: see the module docstring. ``env_config`` keys:
    ``repeat_delay`` (1), ``episode_len`` (100), ``continuous`` (False: ``Discrete(2)``
    observations and actions; True: ``Box(-1, 1, (2,))``)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = constructor_config(config)
        self.continuous = bool(config.get("continuous", False))
        self.observation_space: gym.Space = (
            gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32) if self.continuous
            else gym.spaces.Discrete(2))
        self.action_space = self.observation_space
        self.delay = int(config.get("repeat_delay", 1))
        self.episode_len = int(config.get("episode_len", 100))
        self.history: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[Any, dict]:
        """``repeat_delay`` zeros of history, then the first token."""
        super().reset(seed=seed)
        self.history = [0] * self.delay
        return self._next_obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """Paid for repeating the token of ``repeat_delay`` steps ago; cut at the length."""
        target = self.history[-(1 + self.delay)]
        if self.continuous:
            reward = -float(np.sum(np.abs(np.asarray(action) - target)))
        else:
            reward = 1.0 if int(action) == int(target) else -1.0
        truncated = len(self.history) > self.episode_len
        return self._next_obs(), reward, False, truncated, {}

    def _next_obs(self) -> Any:
        token: Any = (self.np_random.random(2).astype(np.float32) if self.continuous
                      else int(self.np_random.integers(2)))
        self.history.append(token)
        return token
