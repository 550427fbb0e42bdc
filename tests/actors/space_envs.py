"""Small made-up envs with structured observation and action spaces (importable by worker
processes as ``tests.actors.space_envs:make``).

The task: each step shows a cue (one of 4) inside the observation; acting on it pays. With
``Discrete(4)`` actions the reward is 1 when the action equals the cue; with
``MultiDiscrete([4, 2])`` it is 0.5 for the cue plus 0.5 for the cue's parity in the
second component. Episodes last ``length`` steps, so a random policy earns about a
quarter (Discrete) or 3/8 (MultiDiscrete) of ``length``, a perfect one ``length``.

``env_config``: ``obs`` is ``"dict"`` (``{"cue": Discrete(4), "noise": Box(3)}``),
``"tuple"`` (``(Box(2), Discrete(4))``: the cue one-hot in the Discrete), ``"image"``
(``{"frame": Box(0, 255, (8, 8, 1), uint8)`` with the cue drawn as a bright row,
``"extra": Box(2)}``) or ``"nested"`` (``{"a": (Discrete(4), Box(1)), "b": Box(2)}``);
``actions`` is ``"discrete"`` or ``"multidiscrete"``; ``length`` (default 10).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

OBS_KINDS = ("dict", "tuple", "image", "nested")


class CueEnv(gym.Env):
    """See the module docstring."""

    def __init__(self, obs: str = "dict", actions: str = "discrete", length: int = 10
                 ) -> None:
        if obs not in OBS_KINDS:
            raise ValueError(f"obs must be one of {OBS_KINDS}, got {obs!r}")
        self.kind = obs
        self.length = length
        self.observation_space = {
            "dict": spaces.Dict({"cue": spaces.Discrete(4),
                                 "noise": spaces.Box(-1, 1, (3,), np.float32)}),
            "tuple": spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(4))),
            "image": spaces.Dict({"frame": spaces.Box(0, 255, (8, 8, 1), np.uint8),
                                  "extra": spaces.Box(-1, 1, (2,), np.float32)}),
            "nested": spaces.Dict({"a": spaces.Tuple((spaces.Discrete(4),
                                                      spaces.Box(-1, 1, (1,), np.float32))),
                                   "b": spaces.Box(-1, 1, (2,), np.float32)}),
        }[obs]
        self.multi = actions == "multidiscrete"
        self.action_space = (spaces.MultiDiscrete([4, 2]) if self.multi
                             else spaces.Discrete(4))
        self._rng = np.random.default_rng()
        self._cue = 0
        self._t = 0

    def _observe(self) -> Any:
        noise = self._rng.uniform(-1, 1, 3).astype(np.float32)
        if self.kind == "dict":
            return {"cue": self._cue, "noise": noise}
        if self.kind == "tuple":
            return (noise[:2], self._cue)
        if self.kind == "nested":
            return {"a": (self._cue, noise[:1]), "b": noise[1:]}
        frame = np.zeros((8, 8, 1), np.uint8)
        frame[2 * self._cue: 2 * self._cue + 2, :, 0] = 255
        return {"frame": frame, "extra": noise[:2]}

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[Any, dict]:
        """New episode with a fresh cue."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        self._cue = int(self._rng.integers(4))
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """Pay for matching the cue; draw the next cue."""
        if self.multi:
            action = np.asarray(action)
            assert action.shape == (2,), action
            reward = 0.5 * (int(action[0]) == self._cue) + 0.5 * (int(action[1]) == self._cue % 2)
        else:
            reward = float(int(action) == self._cue)
        self._t += 1
        self._cue = int(self._rng.integers(4))
        return self._observe(), float(reward), False, self._t >= self.length, {}


def make(config: dict[str, Any]) -> CueEnv:
    """Env factory for ``env: tests.actors.space_envs:make``."""
    return CueEnv(config.get("obs", "dict"), config.get("actions", "discrete"),
                  int(config.get("length", 10)))
