"""After a restore, the rollout workers' schedules go on from the checkpoint's env steps
(issue 37, item 8): epsilon does not start over from its first value."""

from __future__ import annotations

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import Driver

RESTORED_STEPS = 100_000
"""Far past the epsilon schedule's end (1,000 steps)."""


async def test_restored_workers_explore_with_the_restored_runs_epsilon(tmp_path) -> None:
    """A serial Ape-X trainer (linear epsilon 1.0 -> 0.02 over 1,000 steps, not per
    worker) restored at 100,000 env steps: after an iteration of 200 steps its worker's
    policy counts from the restored steps and explores with the final epsilon, 0.02, not
    the ~0.8 of a schedule started over."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {
        "num_workers": 1, "min_iter_time_s": 0, "timesteps_per_iteration": 200,
        "rollout_fragment_length": 16, "max_weight_sync_delay": 16, "learning_starts": 10_000,
        "per_worker_exploration": False, "model": {"fcnet_hiddens": [8]}, "hiddens": [8],
        "exploration_config": {"type": "EpsilonGreedy", "initial_epsilon": 1.0,
                               "final_epsilon": 0.02, "epsilon_timesteps": 1000}})
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            state = await trainer.get_state()
            await trainer.set_state({**state, "timesteps_total": RESTORED_STEPS})
            result = await trainer.train()
            [worker] = trainer.workers
            policy = driver.node.actors[worker.actor_id].instance.worker.get_policy()
        finally:
            await trainer.stop()
    assert result["timesteps_total"] >= RESTORED_STEPS + 200
    assert policy.global_timestep >= RESTORED_STEPS, policy.global_timestep
    assert abs(policy.current_epsilon() - 0.02) < 1e-9, policy.current_epsilon()
