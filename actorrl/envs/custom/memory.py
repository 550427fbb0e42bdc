"""A memory task: the cue is seen once, the answer is asked for later.

``actorrl/MemoryCue-v0`` (registered with gymnasium when :mod:`actorrl.envs` is imported):
an episode is ``delay + 1`` steps. The first observation shows a cue, one of ``num_cues``
values (one-hot); the next ``delay - 1`` observations are blank; the last one shows only a
query flag. The action taken at the query step earns +1 when it names the cue and -1
otherwise; every other step earns 0 whatever the action. Actions never change what is
observed, so a feed-forward policy sees the same query observation whatever the cue and
can only guess (expected return 0 for any such policy with two cues); a policy with
memory can carry the cue to the query and earn 1 per episode.

Observation: ``Box(0, 1, (num_cues + 1,), float32)`` (the cue one-hot, then the query
flag). Actions: ``Discrete(num_cues)``. ``env_config``: ``num_cues`` (2), ``delay`` (3).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

MEMORY_CUE_ID = "actorrl/MemoryCue-v0"


class MemoryCue(gym.Env):
    """The cue-recall task of the module docstring."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, num_cues: int = 2, delay: int = 3) -> None:
        if num_cues < 2:
            raise ValueError(f"num_cues must be >= 2, got {num_cues}")
        if delay < 1:
            raise ValueError(f"delay must be >= 1, got {delay}")
        self.num_cues = int(num_cues)
        self.delay = int(delay)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.num_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(self.num_cues)
        self._cue = 0
        self._t = 0

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, dtype=np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        elif self._t == self.delay:
            obs[self.num_cues] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode with a random cue, shown in the returned observation."""
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.num_cues))
        self._t = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Reward +1 / -1 for the answer at the query step (which ends the episode), 0
        before."""
        if self._t == self.delay:
            reward = 1.0 if int(action) == self._cue else -1.0
            return np.zeros(self.num_cues + 1, dtype=np.float32), reward, True, False, {}
        self._t += 1
        return self._observation(), 0.0, False, False, {}


def register_memory_envs() -> None:
    """Register :data:`MEMORY_CUE_ID` with gymnasium (once)."""
    if MEMORY_CUE_ID not in gym.envs.registry:
        gym.register(id=MEMORY_CUE_ID, entry_point="actorrl.envs.custom.memory:MemoryCue")
