"""Small pixel-observation envs that learn in about a minute on a laptop's CPU, for checking
that an image pipeline (conv encoder, uint8 frames, frame batches) learns at all before
spending hours on Atari. Use by factory path: ``--env actorrl.envs.custom.pixel:catch``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Catch(gym.Env):
    """DeepMind bsuite's Catch: a ball falls one row per step from a random column of the
    top row; the agent moves a paddle on the bottom row left, not at all, or right.
    Reward +1 when the ball lands on the paddle, -1 otherwise (the only non-zero reward,
    at the last of ``rows - 1`` steps). Observations are ``(rows, columns, 1)`` uint8
    frames (255 where the ball and the paddle are), or ``(1, rows, columns)`` with
    ``channels_first``. A uniformly random policy scores about -0.6 on the default 10x5
    board; the optimal one scores 1.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, rows: int = 10, columns: int = 5, channels_first: bool = False,
                 scale: int = 1) -> None:
        if rows < 3 or columns < 2 or scale < 1:
            raise ValueError(f"Catch needs rows >= 3, columns >= 2 and scale >= 1, got "
                             f"rows={rows}, columns={columns}, scale={scale}")
        self.rows, self.columns, self.scale = rows, columns, scale
        self.channels_first = channels_first
        height, width = rows * scale, columns * scale
        shape = (1, height, width) if channels_first else (height, width, 1)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._ball = (0, 0)
        self._paddle = 0

    def _observation(self) -> np.ndarray:
        board = np.zeros((self.rows, self.columns), np.uint8)
        board[self._ball] = 255
        board[self.rows - 1, self._paddle] = 255
        if self.scale > 1:
            board = np.kron(board, np.ones((self.scale, self.scale), np.uint8))
        return board[None] if self.channels_first else board[:, :, None]

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        """A new ball in a random column of the top row; the paddle in the middle."""
        super().reset(seed=seed)
        self._ball = (0, int(self.np_random.integers(self.columns)))
        self._paddle = self.columns // 2
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Move the paddle by ``action - 1``, drop the ball one row."""
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self.columns - 1))
        self._ball = (self._ball[0] + 1, self._ball[1])
        landed = self._ball[0] == self.rows - 1
        reward = (1.0 if self._ball[1] == self._paddle else -1.0) if landed else 0.0
        return self._observation(), reward, landed, False, {}


def catch(env_config: dict[str, Any]) -> Catch:
    """Factory for ``--env actorrl.envs.custom.pixel:catch``; ``env_config`` keys are
    :class:`Catch`'s arguments (rows, columns, channels_first, scale)."""
    return Catch(**dict(env_config))
