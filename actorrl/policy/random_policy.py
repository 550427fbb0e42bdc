"""A fixed policy acting uniformly at random: an opponent or a baseline in multi-agent runs.

``multiagent.policies`` names it by class path, and leaving it out of
``policies_to_train`` keeps it out of the learner's work::

    multiagent:
      policies:
        learner: [null, null, null, {}]
        random: ["actorrl.policy.random_policy:RandomPolicy", null, null, {}]
      policies_to_train: [learner]

With an action-mask observation (:mod:`actorrl.policy.action_masking`) it draws among the
legal actions only. Any action space that gymnasium can sample works. Its model is one
unused parameter, so weights, checkpoints and evaluation handle it like any policy. Its
random stream starts from torch's global generator, which rollout workers seed from their
``seed``: runs with a seed repeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorrl.policy.action_masking import ActionMaskLayout
from actorrl.policy.base import LossOutput, TorchPolicy
from actorrl.policy.config import PolicyConfig


class RandomPolicy(TorchPolicy):
    """Uniformly random actions (among the legal ones under an action mask); it never
    learns (its loss is zero)."""

    config_class = PolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: PolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        self.layout = ActionMaskLayout.of(observation_space)
        if self.layout is not None:
            self.layout.check_action_space(action_space)
        super().__init__(observation_space, action_space, config, device)
        # Drawn from torch's generator, which a rollout worker seeds from its ``seed``.
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        self._rng = np.random.default_rng(seed)
        self.action_space.seed(seed)

    def make_model(self) -> torch.nn.Module:
        """A module with one unused parameter (weights and optimizer stay well defined)."""
        model = torch.nn.Module()
        model.register_parameter("unused", torch.nn.Parameter(torch.zeros(1)))
        return model

    def compute_actions(self, obs: np.ndarray, explore: bool = True, **_: Any
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One random action per row (``explore`` makes no difference)."""
        count = len(obs)
        if self.layout is not None:
            scores = self._rng.random((count, self.layout.mask_size))
            legal = self.layout.legal(np.asarray(obs))
            if isinstance(self.action_space, gym.spaces.Discrete):
                actions = np.where(legal, scores, -1.0).argmax(axis=1)
                return actions.astype(np.int64), {}
            parts, start = [], 0
            for n in self.action_space.nvec:
                part = np.where(legal[:, start:start + n], scores[:, start:start + n], -1.0)
                parts.append(part.argmax(axis=1))
                start += int(n)
            return np.stack(parts, axis=1).astype(np.int64), {}
        return np.stack([np.asarray(self.action_space.sample()) for _ in range(count)]), {}

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Zero: nothing to learn."""
        return LossOutput(loss=model.unused.sum() * 0.0)
