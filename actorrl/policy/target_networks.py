"""The checkpoint state of a policy with target networks (DQN, SAC, DDPG/TD3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from actorrl.policy.base import TorchPolicy


class TargetNetworkPolicy(TorchPolicy):
    """A :class:`TorchPolicy` with a ``target_model`` and target-update counters
    (``num_steps_trained``, ``last_target_update_steps``, ``num_target_updates``), which
    its subclass sets in ``__init__``: checkpoints carry them with the base state."""

    target_model: torch.nn.Module
    num_steps_trained: int
    last_target_update_steps: int
    num_target_updates: int

    def get_state(self) -> dict[str, Any]:
        """The base state plus the target networks and the target-update counters."""
        state = super().get_state()
        state["target_weights"] = {k: v.detach().cpu().numpy().copy()
                                   for k, v in self.target_model.state_dict().items()}
        state["num_steps_trained"] = self.num_steps_trained
        state["last_target_update_steps"] = self.last_target_update_steps
        state["num_target_updates"] = self.num_target_updates
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned."""
        super().set_state(state)
        if "target_weights" in state:
            self.target_model.load_state_dict(
                {k: torch.as_tensor(np.asarray(v)) for k, v in state["target_weights"].items()})
        self.num_steps_trained = int(state.get("num_steps_trained", 0))
        self.last_target_update_steps = int(state.get("last_target_update_steps", 0))
        self.num_target_updates = int(state.get("num_target_updates", 0))
