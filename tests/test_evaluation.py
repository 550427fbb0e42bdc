"""Evaluation during training: separate evaluation workers with exploration off report an
``evaluation`` section every ``evaluation_interval`` iterations; config errors name the key."""

from __future__ import annotations

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.runtime import Driver


@pytest.mark.parametrize("values,fragment", [
    ({"evaluation_duration": 0}, "evaluation_duration must be >= 1"),
    ({"evaluation_duration_unit": "steps"}, "evaluation_duration_unit must be"),
    ({"evaluation_num_workers": -1}, "evaluation_num_workers must be >= 0"),
    ({"evaluation_config": {"buffer_size": 5}}, "evaluation_config: key 'buffer_size'"),
    ({"evaluation_config": {"explore": "no"}}, "explore must be true or false"),
])
def test_bad_evaluation_settings_are_refused_naming_the_key(values, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(get_algorithm("impala").config_cls, {"evaluation_interval": 1, **values})
    assert fragment in str(info.value)


def test_evaluation_workers_do_not_explore_unless_told() -> None:
    cls = get_algorithm("apex").config_cls
    config = load_config(cls, {"evaluation_interval": 2,
                               "evaluation_config": {"env_config": {"x": 1}}})
    worker = config.evaluation_worker_config()
    assert worker.rollout.explore is False and worker.rollout.env_config == {"x": 1}
    told = load_config(cls, {"evaluation_config": {"explore": True}})
    assert told.evaluation_worker_config().rollout.explore is True
    assert config.worker_config().rollout.explore is True  # training workers unchanged


@pytest.mark.parametrize("unit,duration", [
    pytest.param("episodes", 5, marks=pytest.mark.learning),  # trains to a return of 150
    ("timesteps", 300)])
async def test_impala_cartpole_reports_evaluation_every_interval(unit, duration, tmp_path):
    """IMPALA learns CartPole while a greedy evaluation worker reports every second
    iteration; counted in episodes, the greedy policy's mean return reaches 150 within the
    budget (a learning test); counted in timesteps, four iterations show the reports."""
    spec = get_algorithm("impala")
    config = load_config(spec.config_cls, {
        "num_workers": 2, "seed": 0, "evaluation_interval": 2,
        "min_iter_time_s": 1.0 if unit == "episodes" else 0.5,
        "evaluation_duration": duration, "evaluation_duration_unit": unit})
    results = []
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            for _ in range(60 if unit == "episodes" else 4):
                results.append(await trainer.train())
                evaluation = results[-1].get("evaluation") or {}
                if evaluation.get("episode_reward_mean", 0) >= 150:
                    break
        finally:
            await trainer.stop()
    evaluated = [r for r in results if "evaluation" in r]
    assert [r["training_iteration"] for r in evaluated] == \
        [r["training_iteration"] for r in results if r["training_iteration"] % 2 == 0]
    for r in evaluated:
        section = r["evaluation"]
        if unit == "episodes":
            assert section["episodes_this_iter"] >= duration
        else:
            assert section["timesteps_this_iter"] >= duration
        assert set(section) >= {"episode_reward_mean", "episode_reward_min",
                                "episode_reward_max", "episode_len_mean", "custom_metrics"}
    if unit == "episodes":
        best = max(r["evaluation"]["episode_reward_mean"] for r in evaluated)
        assert best >= 150, [(r["timesteps_total"], r["evaluation"]["episode_reward_mean"])
                             for r in evaluated]


async def test_a_killed_evaluation_worker_is_replaced_and_the_next_evaluation_completes(
        tmp_path) -> None:
    """SIGKILL of an evaluation worker between two evaluations (A2C, two evaluation
    workers, an evaluation every iteration, one step each): the next evaluation finds it
    dead, starts a replacement with the learner's weights in its slot and still reports
    the configured 5 episodes; the restart is reported. Bounded by iterations."""
    import os
    import signal

    spec = get_algorithm("a2c")
    config = load_config(spec.config_cls, {
        "num_workers": 1, "seed": 0, "train_batch_size": 256, "microbatch_size": 128,
        "min_iter_time_s": 0, "timesteps_per_iteration": 0, "evaluation_interval": 1,
        "evaluation_num_workers": 2, "evaluation_duration": 5})
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            first = await trainer.train()
            victim = trainer.evaluator.workers[0]
            os.kill(driver.node.process_of(victim).pid, signal.SIGKILL)
            second = await trainer.train()
            workers = list(trainer.evaluator.workers)
        finally:
            await trainer.stop()
    assert first["evaluation"]["episodes_this_iter"] >= 5
    assert first["evaluation"]["num_worker_restarts"] == 0
    evaluation = second["evaluation"]
    assert evaluation["episodes_this_iter"] >= 5, evaluation
    assert evaluation["num_worker_restarts"] == 1
    assert len(workers) == 2 and victim not in workers
