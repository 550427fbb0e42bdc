"""End to end: each algorithm, with 2 rollout worker processes and a learner process, learns
CartPole-v1 to a mean return of 150 within a bounded time, and leaves no process behind.
(Ape-X going on after a SIGKILLed worker and shard trains to no threshold: it is in
tests/test_failures.py, in the fast subset.)"""

from __future__ import annotations

import time

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import Driver
from tests.helpers.procs import pids_alive

pytestmark = pytest.mark.learning

THRESHOLD = 150.0
BUDGET_S = {"apex": 180.0, "a3c": 150.0, "a2c": 150.0, "impala": 150.0}


def _actor_pids(driver: Driver) -> list[int]:
    return [running.process.pid for running in driver.node.actors.values()]


@pytest.mark.parametrize("algorithm", ["apex", "a3c", "a2c", "impala"])
async def test_algorithm_learns_cartpole(algorithm, tmp_path):
    """Mean episode return reaches 150 on CartPole-v1 with 2 workers within the budget."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": 1.0})
    best = float("-inf")
    history = []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        pids = _actor_pids(driver)
        assert len(pids) >= 3  # 2 workers + learner (+ replay shard)
        start = time.monotonic()
        while time.monotonic() - start < BUDGET_S[algorithm]:
            result = await trainer.train()
            reward = result["episode_reward_mean"]
            history.append((result["timesteps_total"], round(reward, 1)))
            if reward == reward:  # not NaN
                best = max(best, reward)
            if best >= THRESHOLD:
                break
        assert result["timesteps_total"] > 0 and result["num_steps_trained"] > 0
        await trainer.stop()
    assert best >= THRESHOLD, f"{algorithm} reached only {best}: {history}"
    assert pids_alive(pids, timeout_s=15) == []
