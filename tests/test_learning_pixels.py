"""Learning on pixels: IMPALA and Ape-X, each with 2 rollout worker processes and a learner,
learn Catch from 20x10 uint8 frames through the default conv encoder to a mean return of
0.8 (a random policy scores about -0.6, the best 1.0) within a bounded time."""

from __future__ import annotations

import time

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import Driver

pytestmark = pytest.mark.learning

THRESHOLD = 0.8
BUDGET_S = 120.0
SETTINGS = {
    "impala": {"lr": 1e-3, "num_envs_per_worker": 5, "rollout_fragment_length": 45,
               "train_batch_size": 450},
    "apex": {"hiddens": [64], "exploration_config": {
        "type": "EpsilonGreedy", "initial_epsilon": 1.0, "final_epsilon": 0.02,
        "epsilon_timesteps": 5000}},
}


@pytest.mark.parametrize("algorithm", ["impala", "apex"])
async def test_algorithm_learns_catch_from_pixels(algorithm, tmp_path):
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {
        "env": "actorrl.envs.custom.pixel:catch", "env_config": {"scale": 2}, "num_workers": 2,
        "seed": 0, "min_iter_time_s": 1.0,
        "model": {"fcnet_hiddens": [64], "fcnet_activation": "relu"},
        **SETTINGS[algorithm]})
    best, history = float("-inf"), []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        start = time.monotonic()
        while time.monotonic() - start < BUDGET_S and best < THRESHOLD:
            result = await trainer.train()
            reward = result["episode_reward_mean"]
            history.append((result["timesteps_total"], round(reward, 2)))
            if reward == reward:  # not NaN
                best = max(best, reward)
        await trainer.stop()
    assert best >= THRESHOLD, f"{algorithm} reached only {best}: {history}"
