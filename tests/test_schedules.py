"""``lr_schedule`` and ``entropy_coeff_schedule``: RLlib's format and piecewise-linear
semantics, config errors naming the key, the policy applying them from the global timestep,
and an IMPALA and an A3C run whose learner stats report the scheduled values."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.policy.actor_critic import ActorCriticPolicy
from actorrl.policy.impala import ImpalaPolicy
from actorrl.policy.schedules import PiecewiseSchedule
from actorrl.runtime import Driver

CARTPOLE_OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def test_piecewise_schedule_interpolates_and_holds_the_last_value() -> None:
    schedule = PiecewiseSchedule([[0, 1.0], [100, 0.0], [300, 0.5]])
    assert schedule.value(0) == 1.0
    assert schedule.value(25) == pytest.approx(0.75)
    assert schedule.value(100) == pytest.approx(0.0)
    assert schedule.value(200) == pytest.approx(0.25)
    assert schedule.value(10_000) == 0.5


@pytest.mark.parametrize("key,value,fragment", [
    ("lr_schedule", [[100, 0.001], [200, 0.0001]], "must start at timestep 0"),
    ("lr_schedule", [[0, 0.001], [200]], "lr_schedule[1] must be a [timestep, value] pair"),
    ("lr_schedule", [[0, 0.001], [200, 0.002], [100, 0.0]], "non-decreasing"),
    ("lr_schedule", [[0, -0.001]], "values must be >= 0"),
    ("lr_schedule", 0.001, "lr_schedule must be"),
    ("entropy_coeff_schedule", [[10, 0.01]], "must start at timestep 0"),
])
def test_bad_schedules_are_refused_naming_the_key(key, value, fragment) -> None:
    spec = get_algorithm("impala")
    with pytest.raises(ConfigError) as info:
        load_config(spec.config_cls, {key: value})
    assert fragment in str(info.value) and key in str(info.value)


def test_entropy_schedule_is_unknown_to_apex_and_lr_schedule_known() -> None:
    spec = get_algorithm("apex")
    with pytest.raises(ConfigError, match="entropy_coeff_schedule"):
        load_config(spec.config_cls, {"entropy_coeff_schedule": [[0, 0.01]]})
    config = load_config(spec.config_cls, {"lr_schedule": [[0, 0.001], [1000, 0.0001]]})
    assert config.policy.lr_schedule == [[0.0, 0.001], [1000.0, 0.0001]]


@pytest.mark.parametrize("policy_cls", [ImpalaPolicy, ActorCriticPolicy])
def test_policy_applies_schedules_from_the_global_timestep(policy_cls) -> None:
    """The optimizer's lr and the loss's entropy weight follow the global timestep, and the
    learner stats report them as ``cur_lr`` and ``entropy_coeff``."""
    policy = policy_cls(CARTPOLE_OBS, gym.spaces.Discrete(2), {
        "lr_schedule": [[0, 0.01], [1000, 0.001]],
        "entropy_coeff_schedule": [[0, 0.1], [1000, 0.0]],
        "rollout_fragment_length": 4, "model": {"fcnet_hiddens": [8]}})
    assert policy.cur_lr == 0.01 and policy.entropy_coeff == 0.1
    policy.on_global_timestep(500)
    assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.0055)
    assert policy.entropy_coeff == pytest.approx(0.05)
    from actorrl.data.batch import SampleBatch
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (8, 4)).astype(np.float32)
    actions, extra = policy.compute_actions(obs)
    batch = SampleBatch({
        "obs": obs, "new_obs": obs, "actions": actions,
        "rewards": np.ones(8, np.float32), "terminateds": np.zeros(8, bool),
        "truncateds": np.zeros(8, bool), "advantages": np.ones(8, np.float32),
        "value_targets": np.ones(8, np.float32), **extra})
    policy.on_global_timestep(5000)
    stats = policy.learn_on_batch(batch)["learner_stats"]
    assert stats["cur_lr"] == pytest.approx(0.001)
    assert stats["entropy_coeff"] == 0.0
    # A restored checkpoint keeps the optimizer state but follows its own timestep.
    state = policy.get_state()
    state["global_timestep"] = 250
    policy.set_state(state)
    assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.00775)


@pytest.mark.parametrize("algorithm", ["impala", "a3c"])
async def test_training_reports_the_scheduled_values(algorithm, tmp_path) -> None:
    """Over a short run, ``cur_lr`` and ``entropy_coeff`` in the learner stats
    fall as the schedules say at the run's timestep (within one train batch)."""
    spec = get_algorithm(algorithm)
    horizon = 8_000  # about 16 train batches of either algorithm, past the schedules end
    config = load_config(spec.config_cls, {
        # Iterations end on env steps, never on time: a time-bounded iteration sampled past
        # the horizon in one go on a fast machine, so no intermediate value was reported.
        "num_workers": 1, "seed": 0, "min_iter_time_s": 0, "timesteps_per_iteration": 1000,
        "lr_schedule": [[0, 0.01], [horizon, 0.0001]],
        "entropy_coeff_schedule": [[0, 0.2], [horizon, 0.0]],
        # A3C: 32 envs x 16 steps = 512 rows a gradient (under the slack below), one
        # gradient a step: the horizon's env steps in far fewer forward passes and updates.
        **({"grads_per_step": 1, "num_envs_per_worker": 32} if algorithm == "a3c" else {})})
    lrs = []
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            for _ in range(60):  # 1,000+ env steps each: the horizon is passed by ~the 10th
                result = await trainer.train()
                stats = result["info"]["learner"]
                stats = stats.get("default_policy", stats)
                if "cur_lr" in stats:
                    lrs.append((result["timesteps_total"], stats["cur_lr"],
                                stats["entropy_coeff"]))
                if lrs and lrs[-1][0] > horizon + 2000:
                    break
        finally:
            await trainer.stop()
    assert lrs, "the learner stats never reported cur_lr"
    first_t, first_lr, first_entropy = lrs[0]
    last_t, last_lr, last_entropy = lrs[-1]
    assert last_t > horizon
    assert last_lr == pytest.approx(0.0001) and last_entropy == pytest.approx(0.0), lrs
    assert first_lr > last_lr and first_entropy > last_entropy, lrs
    schedule = PiecewiseSchedule([[0, 0.01], [horizon, 0.0001]])
    slack = 2 * config.train_batch_size + 1000
    for t, lr, _ in lrs:  # the learner lags the driver's count by a little only
        assert schedule.value(t) <= lr <= schedule.value(max(0, t - slack)) + 1e-12, lrs
