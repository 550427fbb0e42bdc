"""Multi-tower learning with the losses the seeds run on it: IMPALA's V-trace (the
multi-GPU learner's client) and Ape-X's DQN (``_fake_gpus`` honoured), each equal to the
one-device update; per-sample outputs come back in the batch's row order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actorrl.algorithms import get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.data.batch import SampleBatch
from actorrl.learner.towers import TowerSet
from actorrl.rollout import RolloutWorker

IMPALA_POLICY = "actorrl.policy.impala:ImpalaPolicy"
DQN_POLICY = "actorrl.policy.dqn:DQNPolicy"
FRAGMENT = 16
IMPALA_CONFIG = {
    "num_envs_per_worker": 4, "rollout_fragment_length": FRAGMENT, "lr": 1e-2,
    "grad_clip": 40.0, "model": {"fcnet_hiddens": [16, 16], "fcnet_activation": "tanh"},
}
DQN_CONFIG = {
    "num_envs_per_worker": 4, "rollout_fragment_length": 16, "lr": 1e-2, "n_step": 3,
    "model": {"fcnet_hiddens": [16], "fcnet_activation": "relu"}, "hiddens": [16],
    "train_batch_size": 64,
}


def _params(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def _sample(policy: str, config: dict, rows: int, seed: int) -> SampleBatch:
    worker = RolloutWorker("CartPole-v1", policy, {**config, "seed": seed})
    batches = []
    while sum(b.count for b in batches) < rows:
        batches.append(worker.sample())
    return SampleBatch.concat_samples(batches).slice(0, rows)


def _learn_both_ways(policy: str, config: dict, batch: SampleBatch, num_towers: int):
    """One update on one device and one on ``num_towers`` CPU towers from the same start:
    (one-device policy, its info, towered policy, its info, the tower set)."""
    reference = RolloutWorker("CartPole-v1", policy, {**config, "seed": 3}).get_policy()
    towered = RolloutWorker("CartPole-v1", policy, {**config, "seed": 3}).get_policy()
    towered.set_weights(reference.get_weights())
    reference_info = reference.learn_on_batch(batch)
    towers = TowerSet(towered, [torch.device("cpu")] * num_towers, num_stacks=1)
    towers.load(batch, 0)
    towered_info = towers.learn_on_loaded(0)
    return reference, reference_info, towered, towered_info, towers


def _assert_same_update(reference, towered, towers) -> None:
    for a, b in zip(_params(reference.model), _params(towered.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for replica in towers.replicas[1:]:
        for a, b in zip(_params(towered.model), _params(replica)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num_towers", [2, 4])
def test_impala_vtrace_on_towers_equals_the_one_device_update(num_towers):
    """Off-policy batches (sampled by other weights, episodes ending inside fragments):
    N towers of whole V-trace sequences end one update with the one-device parameters."""
    torch.manual_seed(0)
    batch = _sample(IMPALA_POLICY, IMPALA_CONFIG, 8 * FRAGMENT, seed=11)
    assert batch["terminateds"].any()  # episodes end inside the fragments
    # A behaviour policy far from the learner's (fresh nets act near-uniformly): importance
    # ratios on both sides of the clip.
    rng = np.random.default_rng(0)
    batch["action_logp"] = np.log(rng.uniform(0.1, 0.95, batch.count)).astype(np.float32)
    reference, ref_info, towered, info, towers = _learn_both_ways(
        IMPALA_POLICY, IMPALA_CONFIG, batch, num_towers)
    assert ref_info["learner_stats"]["var_IS"] > 0.1  # off-policy
    _assert_same_update(reference, towered, towers)
    # Losses are means over equal shards: their tower mean is the one-device value.
    for key in ("policy_loss", "vf_loss", "entropy"):
        assert info["learner_stats"][key] == pytest.approx(ref_info["learner_stats"][key],
                                                           rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("num_towers", [2, 4])
def test_dqn_on_towers_equals_the_one_device_update_with_td_error_in_row_order(num_towers):
    """Ape-X's loss on N towers: the same update, and td_error row for row (the replay
    priorities go back to the rows they belong to)."""
    torch.manual_seed(0)
    batch = _sample(DQN_POLICY, DQN_CONFIG, 64, seed=11)
    batch["weights"] = np.linspace(0.5, 1.5, batch.count).astype(np.float32)
    reference, ref_info, towered, info, towers = _learn_both_ways(
        DQN_POLICY, DQN_CONFIG, batch, num_towers)
    _assert_same_update(reference, towered, towers)
    assert info["td_error"].shape == (batch.count,)
    np.testing.assert_allclose(info["td_error"], ref_info["td_error"], rtol=1e-5, atol=1e-6)


def test_apex_honours_fake_gpus():
    """Ape-X's learner gets num_gpus and _fake_gpus as given (it used to drop them): two
    CPU towers, a batch that must split across them."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {"num_gpus": 2, "_fake_gpus": True,
                                           "train_batch_size": 64})
    learner = spec.learner_config(config)
    assert learner.multi_tower and learner.num_towers == 2
    with pytest.raises(ConfigError, match="divide evenly across 2 towers"):
        load_config(spec.config_cls, {"num_gpus": 2, "_fake_gpus": True,
                                      "train_batch_size": 63})
