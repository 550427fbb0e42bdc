"""The seeds' keys and counters that actorrl had refused or left out: deprecated key names
map with a DeprecationWarning, Ape-X's step timers, A2C sampling with the local worker."""

from __future__ import annotations

import time

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.runtime import Driver


@pytest.mark.parametrize(("algorithm", "old", "new", "value", "where"), [
    ("impala", "sample_batch_size", "rollout_fragment_length", 25, "rollout"),
    ("a2c", "sample_batch_size", "rollout_fragment_length", 12, "rollout"),
    ("impala", "num_data_loader_buffers", "num_multi_gpu_tower_stacks", 3, "learner"),
    ("apex", "num_data_loader_buffers", "num_multi_gpu_tower_stacks", 2, "learner"),
])
def test_deprecated_keys_map_to_their_new_names_with_a_warning(algorithm, old, new, value,
                                                               where):
    """As RLlib did: the old name sets the new key and warns, naming both."""
    spec = get_algorithm(algorithm)
    values = {old: value, "train_batch_size": 100 if algorithm != "a2c" else 600}
    with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated; use '{new}'"):
        config = load_config(spec.config_cls, values)
    assert getattr(getattr(config, where), new) == value
    assert old not in config.to_dict() and new in config.to_dict()[where]


def test_deprecated_and_new_key_disagreeing_is_refused():
    """Both spellings with different values: refused, naming both keys."""
    spec = get_algorithm("impala")
    with pytest.warns(DeprecationWarning), pytest.raises(
            ConfigError, match="'sample_batch_size' .*'rollout_fragment_length'"):
        load_config(spec.config_cls, {"sample_batch_size": 25, "rollout_fragment_length": 50})
    with pytest.warns(DeprecationWarning), pytest.raises(
            ConfigError, match="num_multi_gpu_tower_stacks.*num_data_loader_buffers"):
        load_config(get_algorithm("a2c").config_cls, {"num_data_loader_buffers": 2})


async def test_apex_reports_the_seeds_train_and_sample_timers(tmp_path):
    """With debug, timing_breakdown has train_time_ms and sample_time_ms (each step's
    duration; train only once learning started), next to the other timers."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {"num_workers": 1, "seed": 0, "debug": True,
                                           "learning_starts": 200, "min_iter_time_s": 0.5})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        deadline = time.monotonic() + 120
        result = await trainer.train()
        while result["num_steps_trained"] == 0 and time.monotonic() < deadline:
            result = await trainer.train()
        await trainer.stop()
    timing = result["info"]["timing_breakdown"]
    assert result["num_steps_trained"] > 0
    assert timing["sample_time_ms"] > 0 and timing["train_time_ms"] > 0
    assert {"put_weights_time_ms", "get_samples_time_ms", "replay_processing_time_ms",
            "update_priorities_time_ms", "learner_grad_time_ms"} <= set(timing)


@pytest.mark.slow
async def test_a2c_samples_with_the_local_worker_when_num_workers_is_0(tmp_path):
    """num_workers: 0 (the seeds' microbatch optimizer allows it): the learner's local
    worker samples and learns CartPole, and its episodes are reported."""
    spec = get_algorithm("a2c")
    config = load_config(spec.config_cls, {"num_workers": 0, "seed": 0,
                                           "min_iter_time_s": 1.0})
    best, history = float("-inf"), []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        assert trainer.workers == []
        start = time.monotonic()
        while time.monotonic() - start < 150 and best < 100:
            result = await trainer.train()
            history.append(round(result["episode_reward_mean"], 1))
            if result["episode_reward_mean"] == result["episode_reward_mean"]:
                best = max(best, result["episode_reward_mean"])
        await trainer.stop()
    assert result["num_healthy_workers"] == 0
    assert result["num_steps_trained"] == result["timesteps_total"] > 0
    assert best >= 100, history
