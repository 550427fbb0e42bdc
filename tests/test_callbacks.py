"""Callbacks by class path: episode and sample hooks on the rollout workers,
``on_train_result`` on the driver, ``custom_metrics`` aggregated as RLlib does and written
to every result sink, config errors naming the key, a raising hook failing the run."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.callbacks import CustomMetricsWindow, summarize_custom_metrics
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.experiment.plot import plot_runs
from actorrl.experiment.progress import plain_line
from actorrl.experiment.results import ResultWriter, RunDirectory, read_results
from actorrl.runtime import Driver

COUNTING = "tests.actors.callbacks:CountingCallbacks"


def test_custom_metrics_are_aggregated_as_rllib_does() -> None:
    summary = summarize_custom_metrics([{"a": 1.0, "b": math.nan}, {"a": 3.0}, {"b": 2.0}])
    assert summary == {"a_mean": 2.0, "a_min": 1.0, "a_max": 3.0,
                       "b_mean": 2.0, "b_min": 2.0, "b_max": 2.0}
    window = CustomMetricsWindow(smoothing_episodes=3)
    assert window.update([{"x": 1.0}, {"x": 2.0}]) == {"x_mean": 1.5, "x_min": 1.0,
                                                       "x_max": 2.0}
    # 2 new episodes, topped up with the latest earlier one only
    assert window.update([{"x": 10.0}, {"x": 20.0}])["x_min"] == 2.0
    assert window.update([]) == {"x_mean": 32 / 3, "x_min": 2.0, "x_max": 20.0}


@pytest.mark.parametrize("path,fragment", [
    ("tests.actors.callbacks:Missing", "has no attribute 'Missing'"),
    ("no_such_module_here:Callbacks", "cannot import module"),
    ("tests.actors.callbacks:NotCallbacks", "must be a subclass of"),
    ("not a path", "'pkg.module:name'"),
])
def test_bad_callbacks_are_config_errors_naming_the_key(path, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(get_algorithm("a2c").config_cls, {"callbacks": path})
    assert "callbacks" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("algorithm", ["a2c", "impala"])
async def test_hooks_run_and_custom_metrics_reach_the_result(algorithm, tmp_path) -> None:
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": 0.5, "callbacks": COUNTING})
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            results = [await trainer.train() for _ in range(3)]
        finally:
            await trainer.stop()
    last = results[-1]
    custom = last["custom_metrics"]
    assert last["callback_saw_iteration"] == 3
    assert custom["reward_minus_length_min"] == 0 and custom["reward_minus_length_max"] == 0
    assert custom["infos_minus_length_max"] == 0
    assert 8 <= custom["length_seen_min"] <= custom["length_seen_mean"] \
        <= custom["length_seen_max"] <= 500
    assert custom["samples_before_max"] >= 1  # on_sample_end ran before later episodes
    assert abs(custom["length_seen_mean"] - last["episode_len_mean"]) \
        <= 0.5 * last["episode_len_mean"]


async def test_a_raising_callback_fails_the_iteration_with_its_traceback(tmp_path) -> None:
    spec = get_algorithm("a2c")
    config = load_config(spec.config_cls, {
        "num_workers": 1, "min_iter_time_s": 0.2,
        "callbacks": "tests.actors.callbacks:RaisingCallbacks"})
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            with pytest.raises(RuntimeError, match="callback exploded on purpose") as info:
                await asyncio.wait_for(trainer.train(), timeout=120)
        finally:
            await trainer.stop()
    text = str(info.value)
    assert "callback exploded on purpose" in text and "on_episode_end" in text, text


def test_custom_metrics_reach_csv_jsonl_tensorboard_live_line_and_plot(tmp_path) -> None:
    from tests.helpers.cluster import read_tensorboard_scalars

    run = RunDirectory.create(tmp_path, "a2c", "CartPole-v1")
    writer = ResultWriter(run.path)
    for i in (1, 2):
        writer.record({"training_iteration": i, "timesteps_total": 100 * i,
                       "time_total_s": float(i), "time_this_iter_s": 1.0,
                       "episode_reward_mean": 10.0 * i, "episode_reward_min": 1.0,
                       "episode_reward_max": 20.0 * i,
                       "custom_metrics": {"lives_mean": 2.5 * i, "lives_min": 1.0,
                                          "lives_max": 4.0}})
    writer.close()
    assert read_results(run.path)[-1]["custom_metrics"]["lives_mean"] == 5.0
    header = (run.path / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"custom_metrics/lives_mean", "custom_metrics/lives_max"} <= set(header)
    [events] = Path(run.path).glob("events.out.tfevents.*")
    assert read_tensorboard_scalars(events)["custom_metrics/lives_mean"] == [
        (100, 2.5), (200, 5.0)]
    line = plain_line(read_results(run.path)[-1], {}, 1.0, None)
    assert "custom/lives_mean=5.00" in line
    out = plot_runs([str(run.path)], tmp_path / "curves.png")
    import matplotlib.image
    height, width = matplotlib.image.imread(out).shape[:2]
    assert height > width * 0.6  # the custom metrics row was added under the curves
