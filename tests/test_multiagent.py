"""Multi-agent through every pipeline, on the shipped two-agent env (two CartPoles, one
policy each): per-policy rewards in the results, one replay buffer per policy in each
shard, ``policies_to_train`` leaving an untrained policy's weights untouched, and the
multi-tower learner refused for several policies."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.envs import EpisodeMetrics, EpisodeWindow
from actorrl.envs.custom.multi_agent import TWO_CARTPOLES_MULTIAGENT, policy_for_agent
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver

ENV = "actorrl.envs.custom.multi_agent:two_cartpoles"
POLICIES = ("policy_0", "policy_1")
THRESHOLD = 100.0
BUDGET_S = {"apex": 240.0, "impala": 180.0, "a2c": 180.0, "a3c": 180.0}


def _config(algorithm: str, **overrides: Any):
    spec = get_algorithm(algorithm)
    values = {"env": ENV, "multiagent": TWO_CARTPOLES_MULTIAGENT, "num_workers": 2,
              "seed": 0, "min_iter_time_s": 1.0, **overrides}
    return spec, load_config(spec.config_cls, values)


# ---- fast checks ------------------------------------------------------------------------

def test_the_two_agent_env_reports_each_policys_return():
    """Sampling the env with two policies gives each its own rows and its own return per
    episode; an episode's reward is the sum of both."""
    assert [policy_for_agent(a) for a in ("agent_0", "agent_1")] == list(POLICIES)
    worker = RolloutWorker(ENV, "actorrl.policy.dqn:DQNPolicy",
                           {"multiagent": TWO_CARTPOLES_MULTIAGENT, "num_envs_per_worker": 2,
                            "rollout_fragment_length": 50, "seed": 1})
    batch = worker.sample()
    assert set(batch.policy_batches) == set(POLICIES)
    while worker.env.metrics.num_episodes < 5:
        worker.sample()
    metrics = worker.get_metrics()
    summary = metrics.summary()
    assert set(summary["policy_reward_mean"]) == set(POLICIES)
    for episode_reward, per_policy in zip(metrics.episode_rewards, metrics.policy_rewards):
        assert sorted(pid for pid, _ in per_policy) == list(POLICIES)
        assert sum(r for _, r in per_policy) == pytest.approx(episode_reward)


def test_policy_rewards_merge_smooth_and_stay_empty_for_one_agent():
    """Workers' per-policy rewards merge; the window smooths them like the episode reward;
    single-agent episodes report empty per-policy dicts (as RLlib)."""
    a, b = EpisodeMetrics(), EpisodeMetrics()
    a.record(30.0, 20, [("p", 10.0), ("q", 20.0)])
    b.record(50.0, 25, [("p", 30.0), ("q", 20.0)])
    merged = EpisodeMetrics.merge([a, b])
    window = EpisodeWindow(2)
    assert window.update(merged)["policy_reward_mean"] == {"p": 20.0, "q": 20.0}
    c = EpisodeMetrics()
    c.record(70.0, 30, [("p", 50.0), ("q", 20.0)])
    smoothed = window.update(c)  # the last 2 episodes
    assert smoothed["policy_reward_mean"] == {"p": 40.0, "q": 20.0}
    assert smoothed["policy_reward_max"] == {"p": 50.0, "q": 20.0}
    single = EpisodeMetrics()
    single.record(12.0, 12)
    assert single.summary()["policy_reward_mean"] == {}


@pytest.mark.parametrize("algorithm", ["impala", "apex", "a3c", "a2c"])
def test_several_policies_with_multi_tower_learning_is_refused(algorithm):
    """As in the seeds, the multi-GPU learner takes one policy: refused at config time,
    naming both keys."""
    with pytest.raises(ConfigError, match=r"multiagent\.policies.*num_gpus > 1"):
        _config(algorithm, num_gpus=2, _fake_gpus=True, train_batch_size=1000)


# ---- through the pipelines ------------------------------------------------------------

async def _weights(trainer: Trainer) -> dict[str, dict[str, np.ndarray]]:
    assert trainer.learner is not None
    return (await trainer.runtime.get_async(trainer.learner.get_weights.remote(),
                                            timeout_s=60))["weights"]


@pytest.mark.parametrize("algorithm", ["apex", "impala", "a3c", "a2c"])
async def test_policies_to_train_leaves_the_other_policy_untouched(algorithm, tmp_path):
    """Training only policy_0: its weights change, policy_1's stay byte-identical (at the
    learner and on the workers), while both policies act and are reported."""
    # Short iterations (and A3C steps of 10 gradients, not 100): the loop below trains
    # only until the first update and the first reported episodes.
    short = {"min_iter_time_s": 0.3, **({"grads_per_step": 10} if algorithm == "a3c" else {})}
    spec, config = _config(algorithm, num_workers=1, learning_starts=200, **short,
                           multiagent={**TWO_CARTPOLES_MULTIAGENT,
                                       "policies_to_train": ["policy_0"]}
                           ) if algorithm == "apex" else _config(
        algorithm, num_workers=1, **short,
        multiagent={**TWO_CARTPOLES_MULTIAGENT, "policies_to_train": ["policy_0"]})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        before = await _weights(trainer)
        deadline = time.monotonic() + 120
        result = await trainer.train()
        while (result["num_steps_trained"] == 0 or not result["policy_reward_mean"]) \
                and time.monotonic() < deadline:
            result = await trainer.train()
        after = await _weights(trainer)
        worker_weights = await trainer.runtime.get_async(
            trainer.workers[0].get_weights.remote(), timeout_s=60)
        await trainer.stop()
    assert result["num_steps_trained"] > 0
    assert set(result["policy_reward_mean"]) == set(POLICIES)
    assert any(not np.array_equal(before["policy_0"][k], after["policy_0"][k])
               for k in before["policy_0"])
    for key, value in before["policy_1"].items():
        assert after["policy_1"][key].tobytes() == value.tobytes(), key
        assert np.asarray(worker_weights["policy_1"][key]).tobytes() == value.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["apex", "impala", "a2c"])
async def test_both_policies_learn_the_two_agent_env(algorithm, tmp_path):
    """Each policy's mean return (policy_reward_mean) reaches the threshold within the
    budget; Ape-X's shard keeps one replay buffer per policy."""
    spec, config = _config(algorithm)
    history = []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        start = time.monotonic()
        while time.monotonic() - start < BUDGET_S[algorithm]:
            result = await trainer.train()
            per_policy = result["policy_reward_mean"]
            history.append({pid: round(r, 1) for pid, r in per_policy.items()})
            if len(per_policy) == 2 and min(per_policy.values()) >= THRESHOLD:
                break
        await trainer.stop()
    per_policy = result["policy_reward_mean"]
    assert set(per_policy) == set(POLICIES)
    assert min(per_policy.values()) >= THRESHOLD, f"{algorithm}: {history}"
    assert not math.isnan(result["episode_reward_mean"])
    if algorithm == "apex":
        shard = result["info"]["replay_shard_0"]
        for pid in POLICIES:
            assert shard[f"policy_{pid}"]["added_count"] > 0
            assert shard[f"policy_{pid}"]["num_entries"] > 0
        assert set(result["info"]["learner"]) == set(POLICIES)
