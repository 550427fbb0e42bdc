"""With ``num_workers: 0``, A2C and PPO sample with the learner's local worker: the
trainer collects the episodes' custom metrics and the observation-filter statistics from
it, as it does from remote rollout workers (issue 37, item 8d)."""

from __future__ import annotations

import numpy as np
import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.data.batch import DEFAULT_POLICY_ID
from actorrl.envs.filters import RunningStat
from actorrl.runtime import Driver

SMALL = {
    "a2c": {"train_batch_size": 256, "microbatch_size": 128},
    "ppo": {"train_batch_size": 256, "sgd_minibatch_size": 64, "num_sgd_iter": 1},
}
"""Per algorithm, a short train step (256 env steps: a dozen CartPole episodes of an
untrained policy)."""


@pytest.mark.parametrize("algorithm", ["a2c", "ppo"])
async def test_the_learners_local_worker_reports_custom_metrics_and_syncs_its_filter(
        algorithm, tmp_path) -> None:
    """Two one-step iterations with no remote worker, a callbacks class that reports each
    episode's length and a MeanStdFilter: the results carry the custom metric (equal to
    the episodes' lengths), the master filter holds every observation sampled, and the
    local worker's filter holds the master statistics."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {
        "num_workers": 0, "seed": 0, "min_iter_time_s": 0, "timesteps_per_iteration": 0,
        "callbacks": "tests.actors.callbacks:EpisodeLengthCallbacks",
        "observation_filter": "MeanStdFilter", **SMALL[algorithm]})
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            results = [await trainer.train() for _ in range(2)]
            last = results[-1]
            custom = last["custom_metrics"]
            assert "length_seen_mean" in custom, custom
            assert custom["length_seen_mean"] == pytest.approx(last["episode_len_mean"])
            assert trainer.filter_manager is not None
            master = trainer.filter_manager.state
            assert master is not None and master["n"] >= last["timesteps_total"], master
            get = driver.runtime.get_async
            local = await get(trainer.learner.filter_state.remote(), timeout_s=60)
            buffer = (await get(trainer.learner.get_filters.remote(False),
                                timeout_s=60))[DEFAULT_POLICY_ID]
        finally:
            await trainer.stop()
    expected = RunningStat.from_state(master)
    expected.update(RunningStat.from_state(buffer))
    assert local["n"] == expected.n
    np.testing.assert_allclose(local["mean"], expected.mean, rtol=1e-9, atol=1e-12)
