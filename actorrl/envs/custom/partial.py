"""Partially observed tasks that only a policy with memory can solve.

``actorrl/StatelessCartPole-v1`` (registered with gymnasium when :mod:`actorrl.envs` is
imported): CartPole-v1 with the cart and pole velocities (observation entries 1 and 3)
always zero, like RLlib's ``StatelessCartPole``. The observation keeps CartPole's shape and
bounds; a policy must infer the velocities from successive positions.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

STATELESS_CARTPOLE_ID = "actorrl/StatelessCartPole-v1"
VELOCITY_ENTRIES = (1, 3)


class StatelessCartPole(gym.ObservationWrapper):
    """CartPole-v1 whose velocity entries are zeroed (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.observation_space = self.env.observation_space

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The observation with entries 1 and 3 set to 0."""
        out = np.array(observation, dtype=np.float32, copy=True)
        out[list(VELOCITY_ENTRIES)] = 0.0
        return out


def register_partial_envs() -> None:
    """Register :data:`STATELESS_CARTPOLE_ID` with gymnasium (once)."""
    if STATELESS_CARTPOLE_ID not in gym.envs.registry:
        gym.register(id=STATELESS_CARTPOLE_ID,
                     entry_point="actorrl.envs.custom.partial:StatelessCartPole")
