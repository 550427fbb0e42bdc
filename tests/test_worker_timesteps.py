"""The synchronous pipelines (A2C, PPO) and the trainer's own weight broadcasts (after a
restore, to a replacement worker) tell the rollout workers the run's env-step count, as
Ape-X, IMPALA and A3C do (issue 37, item 8c): a restored or replaced worker's policy counts
from the run's steps, not from 0."""

from __future__ import annotations

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import Driver

RESTORED_STEPS = 100_000
"""The env steps of the restored run."""

SMALL = {
    "a2c": {"train_batch_size": 256, "microbatch_size": 128},
    "ppo": {"train_batch_size": 256, "sgd_minibatch_size": 64, "num_sgd_iter": 1},
}
"""Per algorithm, a short train step (256 env steps)."""


def _policy(driver: Driver, worker):
    """The policy of a serial-mode rollout worker actor (it lives in this process)."""
    return driver.node.actors[worker.actor_id].instance.worker.get_policy()


@pytest.mark.parametrize("algorithm", ["a2c", "ppo"])
async def test_restored_and_replaced_workers_count_from_the_runs_steps(algorithm,
                                                                       tmp_path) -> None:
    """A serial trainer restored at 100,000 env steps: right after the restore its worker's
    policy is at 100,000 (the restore's broadcast); each step's broadcast then sends the
    count before that step (so after two one-step iterations: 100,000 + the first's
    steps); a worker replaced after them starts at the run's count."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {
        "num_workers": 1, "seed": 0, "min_iter_time_s": 0, "timesteps_per_iteration": 0,
        "model": {"fcnet_hiddens": [8]}, **SMALL[algorithm]})
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            state = await trainer.get_state()
            await trainer.set_state({**state, "timesteps_total": RESTORED_STEPS})
            [worker] = trainer.workers
            after_restore = _policy(driver, worker).global_timestep
            first = await trainer.train()
            second = await trainer.train()
            after_steps = _policy(driver, worker).global_timestep
            driver.node.kill_actor(worker)
            new = await trainer.replace_worker(worker)
            assert new is not None
            replaced = _policy(driver, new).global_timestep
        finally:
            await trainer.stop()
    assert after_restore == RESTORED_STEPS
    assert first["timesteps_total"] > RESTORED_STEPS
    assert after_steps == first["timesteps_total"], (after_steps, first["timesteps_total"])
    assert replaced == second["timesteps_total"], (replaced, second["timesteps_total"])
