"""Configs and actor sets shared by the pipeline tests: DQN and actor-critic policies on
CartPole, and two A3C rollout workers with a gradient-applying learner."""

from __future__ import annotations

from typing import Any

from actorrl.algorithms.a3c import A3CConfig
from actorrl.algorithms.apex import ApexConfig
from actorrl.algorithms.impala import ImpalaConfig
from actorrl.config.algorithm import flat_config

DQN = "actorrl.policy.dqn:DQNPolicy"
AC = "actorrl.policy.actor_critic:ActorCriticPolicy"

DQN_CONFIG: dict[str, Any] = {
    **ApexConfig(num_workers=1).to_dict(), "model": {"fcnet_hiddens": [16]},
    "hiddens": [16], "train_batch_size": 32}
"""A small Ape-X DQN on CartPole (a fresh copy per use: ``dict(DQN_CONFIG)``)."""

APEX_PIPELINE: dict[str, Any] = {"learner_queue_size": 16, "max_weight_sync_delay": 400}
"""An Ape-X pipeline's learner queue and weight-sync settings (ApexConfig's defaults), for
tests that set neither."""

IMPALA_PIPELINE: dict[str, Any] = {"broadcast_interval": 1,
                                   "max_sample_requests_in_flight_per_worker": 2}
"""An IMPALA pipeline's broadcast and in-flight settings (ImpalaConfig's defaults)."""

# The single-process learning loops on CartPole-v1 use the algorithms' tuned configs
# (actorrl.algorithms.tuned) as RLlib flat dicts, with the few settings of their own below.

DQN_CARTPOLE: dict[str, Any] = {**flat_config(ApexConfig()), "training_intensity": 16}
"""Single-process DQN with prioritized replay (tests/test_dqn.py): Ape-X's settings,
training 16 rows per env step. A mean return of 150 over 20 episodes came in 7-9k env
steps (seeds 0-6, 5-11 s) and 450 in 37-44k steps."""

IMPALA_CARTPOLE: dict[str, Any] = {
    **flat_config(ImpalaConfig()), "rollout_fragment_length": 20, "train_batch_size": 160,
    "lr": 1e-3}
"""Single-process IMPALA with an actor two updates behind the learner
(tests/test_impala_policy.py): 150 over 20 episodes in 12-19k env steps (seeds 0-6,
2-4 s); 450 in 47-148k env steps (seeds 0-2, 8-29 s)."""

A2C_CARTPOLE: dict[str, Any] = flat_config(A3CConfig())
"""One RolloutWorker, one update per sampled batch of 8 x 16 env steps
(tests/test_actor_critic.py): a 100-episode mean of 150 within 8k-35k env steps (seeds
0-8, 1-6 s) and 450 within 96k-183k (seeds 0-2, 11-30 s)."""


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
