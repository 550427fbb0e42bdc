"""Two A3C rollout workers and a gradient-applying learner on CartPole, for pipeline
tests."""

from __future__ import annotations

from typing import Any

AC = "actorrl.policy.actor_critic:ActorCriticPolicy"


async def a3c_actors(driver: Any, config: dict[str, Any], train_batch_size: int
                     ) -> tuple[list[Any], Any]:
    """``(workers, learner)``: two worker actors and a learner without a learner thread."""
    workers = [await driver.create_actor(
        "actorrl.rollout_actor:RolloutWorkerActor", args=("CartPole-v1", AC, config),
        kwargs={"worker_index": i + 1}) for i in range(2)]
    learner = await driver.create_actor(
        "actorrl.learner.actor:LearnerActor",
        args=("CartPole-v1", AC, config, {"train_batch_size": train_batch_size}),
        kwargs={"start_thread": False})
    return workers, learner
