"""Continuous control learns and stays learned: RLlib's pendulum-ppo file (Pendulum-v1,
its settings unchanged) reaches -400 within 300k env steps and does not collapse over the
next 100k (before the log-std bound it peaked near -360 at 250k, then fell to -950 as the
log-std ran away: tests/test_continuous_actions.py). Bounded by env steps, not time."""

from __future__ import annotations

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.runtime import Driver

pytestmark = pytest.mark.learning

PENDULUM_PPO = {  # RLlib's tuned_examples/ppo/pendulum-ppo.yaml
    "env": "Pendulum-v1", "train_batch_size": 512, "vf_clip_param": 10.0, "num_workers": 0,
    "num_envs_per_worker": 20, "lambda": 0.1, "gamma": 0.95, "lr": 0.0003,
    "sgd_minibatch_size": 64, "num_sgd_iter": 6, "model": {"fcnet_hiddens": [256, 256]},
    "observation_filter": "MeanStdFilter", "seed": 0,
}
REACH, REACH_WITHIN = -400.0, 300_000
HOLD_FOR = 100_000
"""Env steps trained on after first reaching -400 (without the bound the return fell from
its peak by 250 within 60k env steps)."""
HOLD_FINAL, HOLD_LATE_MIN = -400.0, -600.0
"""At the end of those steps the return is still >= -400, and over their second half it
never fell below -600 (an early dip after a first quick crossing is PPO's noise, not the
collapse: that one fell to -900 and stayed, its entropy past 10)."""


@pytest.mark.timeout(1200)  # about 400k env steps: ~100 s alone, far more on a busy machine
async def test_rllib_pendulum_ppo_reaches_minus_400_and_stays(tmp_path):
    spec = get_algorithm("ppo")
    config = load_config(spec.config_cls, PENDULUM_PPO)
    history: list[tuple[int, float]] = []
    reached_at = None
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        while True:
            result = await trainer.train()
            steps, reward = result["timesteps_total"], result["episode_reward_mean"]
            if reward == reward:  # not NaN
                history.append((steps, round(reward, 1)))
                if reached_at is None and reward >= REACH:
                    reached_at = steps
            if reached_at is None and steps >= REACH_WITHIN:
                break
            if reached_at is not None and steps >= reached_at + HOLD_FOR:
                break
        entropy = result["info"]["learner"]["entropy"]
        await trainer.stop()
    assert reached_at is not None, f"never reached {REACH} in {REACH_WITHIN} steps: {history}"
    late = [reward for steps, reward in history if steps > reached_at + HOLD_FOR // 2]
    assert history[-1][1] >= HOLD_FINAL and min(late) >= HOLD_LATE_MIN, (
        f"collapsed after reaching {REACH} at {reached_at}: {history}")
    assert entropy < 2.0, entropy  # log-std well inside its bound (a runaway: 10+)
