"""Configs and actor sets shared by the pipeline tests: DQN and actor-critic policies on
CartPole, and two A3C rollout workers with a gradient-applying learner."""

from __future__ import annotations

from typing import Any

from actorrl.algorithms.apex import ApexConfig

DQN = "actorrl.policy.dqn:DQNPolicy"
AC = "actorrl.policy.actor_critic:ActorCriticPolicy"

DQN_CONFIG: dict[str, Any] = {
    **ApexConfig(num_workers=1).to_dict(), "model": {"fcnet_hiddens": [16]},
    "hiddens": [16], "train_batch_size": 32}
"""A small Ape-X DQN on CartPole (a fresh copy per use: ``dict(DQN_CONFIG)``)."""


async def a3c_actors(driver: Any, config: dict[str, Any], train_batch_size: int,
                     learner_class: str = "actorrl.learner.actor:LearnerActor"
                     ) -> tuple[list[Any], Any]:
    """``(workers, learner)``: two worker actors and a learner (of ``learner_class``)
    without a learner thread."""
    workers = [await driver.create_actor(
        "actorrl.rollout.actor:RolloutWorkerActor", args=("CartPole-v1", AC, config),
        kwargs={"worker_index": i + 1}) for i in range(2)]
    learner = await driver.create_actor(
        learner_class,
        args=("CartPole-v1", AC, config, {"train_batch_size": train_batch_size}),
        kwargs={"start_thread": False})
    return workers, learner
