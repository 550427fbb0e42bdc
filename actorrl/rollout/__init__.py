"""Rollout: the workers that step envs with policies and hand back experience.

- :mod:`actorrl.rollout.worker`: :class:`RolloutWorker`, envs plus policies (plain
  synchronous code: sampling, gradients, weights, observation filters).
- :mod:`actorrl.rollout.samplers`: how a worker collects fragments from its vectorized
  envs (single-agent and multi-agent).
- :mod:`actorrl.rollout.actor`: ``RolloutWorkerActor``, the worker's remote face (the
  seam to the runtime, as ``replay/actor.py`` and ``learner/actor.py``).
"""

from __future__ import annotations

from actorrl.rollout.worker import PolicyClass, RolloutWorker

__all__ = ["PolicyClass", "RolloutWorker"]
