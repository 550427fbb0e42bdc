"""RLlib's noise explorations for deterministic policies acting in [-1, 1] (DDPG, TD3,
Ape-X DDPG), in numpy.

At env step ``t`` (the policy's ``global_timestep`` when it acts):

* ``t < random_timesteps``: uniform random actions in [-1, 1];
* else ``GaussianNoise``: ``clip(a + scale(t) * N(0, stddev), -1, 1)``, one draw per row
  and action dim;
* else ``OrnsteinUhlenbeckNoise`` (RLlib's torch form): one state ``x`` per policy (shared
  by the envs it acts for), ``x += -ou_theta * x + ou_sigma * scale(t) * N(0, 1)``, then
  ``clip(a + scale(t) * ou_base_scale * x * (high - low), -1, 1)`` with ``high - low = 2``.

``scale(t)`` falls linearly from ``initial_scale`` at ``random_timesteps`` to
``final_scale`` at ``random_timesteps + scale_timesteps`` (``final_scale`` outside). The
``PerWorker*`` types use Ape-X's fixed scale instead: ``0.4 ** (1 + 7 (i - 1) / (N - 1))``
on rollout worker ``i`` of ``N`` (:func:`~actorrl.policy.dqn.apex_worker_epsilon`), 0 on
the learner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actorrl.policy.ddpg_config import OU, PER_WORKER

ACTION_RANGE = 2.0
"""``high - low`` of the [-1, 1] space the policies act in."""


def apex_scale(worker_index: int, num_workers: int) -> float:
    """Ape-X's fixed noise scale of ``worker_index`` (0 on the learner, worker 0)."""
    from actorrl.policy.dqn import apex_worker_epsilon

    return 0.0 if worker_index < 1 else apex_worker_epsilon(worker_index, num_workers)


def scheduled_scale(config: dict[str, Any], timestep: int) -> float:
    """The scale at ``timestep``: linear from ``initial_scale`` (at ``random_timesteps``) to
    ``final_scale`` (``scale_timesteps`` later), ``final_scale`` outside that span."""
    start = config["random_timesteps"]
    end = start + config["scale_timesteps"]
    if not start <= timestep < end:
        return float(config["final_scale"])
    frac = (timestep - start) / (end - start)
    return float(config["initial_scale"] + frac * (config["final_scale"]
                                                   - config["initial_scale"]))


class NoiseExploration:
    """One policy's exploration (see the module docstring): ``config`` is the merged
    ``exploration_config``; ``fixed_scale`` replaces the schedule (``PerWorker*``)."""

    def __init__(self, config: dict[str, Any], action_dim: int, rng: np.random.Generator,
                 fixed_scale: float | None = None) -> None:
        self.config = dict(config)
        self.kind = str(config["type"]).removeprefix(PER_WORKER)
        self.rng = rng
        self.fixed_scale = fixed_scale
        self.ou_state = np.zeros(action_dim, dtype=np.float64)
        """The Ornstein-Uhlenbeck process's state (one per policy)."""

    def scale(self, timestep: int) -> float:
        """The noise scale at ``timestep``."""
        if self.fixed_scale is not None:
            return self.fixed_scale
        return scheduled_scale(self.config, timestep)

    def __call__(self, actions: np.ndarray, timestep: int) -> np.ndarray:
        """Exploring actions for deterministic ``actions`` (``[B, action_dim]`` in [-1, 1])
        at env step ``timestep``."""
        cfg = self.config
        if timestep < cfg["random_timesteps"]:
            return self.rng.uniform(-1.0, 1.0, actions.shape)
        scale = self.scale(timestep)
        if self.kind == OU:
            gaussian = scale * self.rng.standard_normal(self.ou_state.shape)
            self.ou_state += cfg["ou_theta"] * -self.ou_state + cfg["ou_sigma"] * gaussian
            noise = scale * cfg["ou_base_scale"] * self.ou_state * ACTION_RANGE
        else:
            noise = scale * cfg["stddev"] * self.rng.standard_normal(actions.shape)
        return np.clip(actions + noise, -1.0, 1.0)


__all__ = ["NoiseExploration", "apex_scale", "scheduled_scale"]
