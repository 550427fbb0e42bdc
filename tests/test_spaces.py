"""Structured spaces: Dict/Tuple observations flattened by the worker and cut back into
leaves by the default models (images through the conv encoder), MultiDiscrete actions as a
product of categoricals, every algorithm sampling and training on them where the math
allows (DQN/Ape-X refuse MultiDiscrete naming the space), and a Dict-observation task
learned end to end."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.data.spaces import flat_leaves, flat_size, observation_preprocessor
from actorrl.policy.action_dist import Categorical, dist_class_for
from actorrl.policy.encoders import ComplexEncoder
from actorrl.policy.model_config import resolve_model_config
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver
from tests.actors.space_envs import CueEnv

ENV = "tests.actors.space_envs:make"


def test_dict_and_tuple_observations_flatten_in_leaf_order() -> None:
    space = spaces.Dict({"b": spaces.Box(-1, 1, (2,)), "a": spaces.Tuple((
        spaces.Discrete(3), spaces.MultiDiscrete([2, 2])))})
    prep = observation_preprocessor(space)
    assert prep is not None and observation_preprocessor(spaces.Box(-1, 1, (2,))) is None
    flat = prep({"b": np.array([0.5, -0.5]), "a": (2, np.array([1, 0]))})
    # keys sorted ("a" first); Discrete one-hot; MultiDiscrete one one-hot per component
    np.testing.assert_array_equal(flat, [0, 0, 1, 0, 1, 1, 0, 0.5, -0.5])
    assert flat.dtype == np.float32 and flat_size(space) == 9
    leaves = flat_leaves(space)
    assert [(leaf.start, leaf.size) for leaf in leaves] == [(0, 3), (3, 4), (7, 2)]
    with pytest.raises(ValueError, match=r"observation space\['t'\] is Text"):
        observation_preprocessor(spaces.Dict({"t": spaces.Text(5)}))


def test_multi_categorical_sums_log_probs_and_entropies() -> None:
    space = spaces.MultiDiscrete([3, 2, 4])
    cls = dist_class_for(space)
    assert cls.required_outputs(space) == 9
    logits = torch.randn(5, 9)
    dist = cls(logits)
    actions = dist.sample()
    assert actions.shape == (5, 3) and (actions < torch.tensor([3, 2, 4])).all()
    parts = [Categorical(p) for p in torch.split(logits, [3, 2, 4], dim=-1)]
    torch.testing.assert_close(dist.logp(actions),
                               sum(p.logp(actions[:, i]) for i, p in enumerate(parts)))
    torch.testing.assert_close(dist.entropy(), sum(p.entropy() for p in parts))
    torch.testing.assert_close(dist.deterministic_sample(),
                               torch.stack([p.inputs.argmax(-1) for p in parts], -1))
    other = cls(torch.randn(5, 9))
    assert (dist.kl(other) >= 0).all() and torch.allclose(dist.kl(dist), torch.zeros(5))


def test_image_leaves_go_through_the_conv_encoder() -> None:
    env = CueEnv("image")
    encoder = ComplexEncoder(env.observation_space, resolve_model_config(None))
    assert len(encoder.convs) == 1 and any(
        isinstance(m, torch.nn.Conv2d) for m in encoder.convs[0].modules())
    prep = observation_preprocessor(env.observation_space)
    obs = torch.as_tensor(np.stack([prep(env.reset(seed=s)[0]) for s in range(8)]))
    before = obs.clone()
    features = encoder(obs)
    assert features.shape == (8, encoder.out_dim)
    torch.testing.assert_close(obs, before)  # the uint8 scaling did not touch the input
    cues = obs[:, :64].reshape(8, 8, 8).amax(dim=2).argmax(dim=1)  # first bright row
    differs = [i for i in range(1, 8) if cues[i] != cues[0]]
    assert differs and not torch.allclose(features[0], features[differs[0]])


# Every observation kind and both action kinds per actor-critic family, each kind of
# observation for Ape-X (Discrete actions only), kept few: every case builds a worker.
ALGORITHM_SPACES = [
    ("impala", "dict", "multidiscrete"), ("impala", "image", "discrete"),
    ("impala", "tuple", "multidiscrete"), ("impala", "nested", "discrete"),
    ("a2c", "image", "multidiscrete"), ("a2c", "dict", "discrete"),
    ("a3c", "tuple", "discrete"), ("a3c", "nested", "multidiscrete"),
    ("apex", "dict", "discrete"), ("apex", "image", "discrete"),
    ("apex", "nested", "discrete"),
]


@pytest.mark.parametrize("algorithm,obs,actions", ALGORITHM_SPACES)
def test_every_algorithm_samples_and_trains_on_structured_spaces(algorithm, obs, actions):
    spec = get_algorithm(algorithm)
    worker = RolloutWorker(ENV, spec.policy, {
        "env_config": {"obs": obs, "actions": actions}, "num_envs_per_worker": 2,
        "rollout_fragment_length": 10, "train_batch_size": 20, "seed": 0})
    batch = worker.sample()
    size = flat_size(worker.env.observation_space)
    assert batch["obs"].shape == (20, size) and batch["new_obs"].shape == (20, size)
    assert batch["actions"].shape == ((20, 2) if actions == "multidiscrete" else (20,))
    before = worker.get_weights()["default_policy"]
    info = worker.learn_on_batch(batch)["default_policy"]
    stats = info["learner_stats"]
    assert all(np.isfinite(v) for v in stats.values()), stats
    after = worker.get_weights()["default_policy"]
    assert any(not np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("algorithm", ["apex"])
def test_q_learning_refuses_multi_discrete_actions_naming_the_space(algorithm) -> None:
    with pytest.raises(ValueError) as info:
        RolloutWorker(ENV, get_algorithm(algorithm).policy,
                      {"env_config": {"actions": "multidiscrete"}})
    message = str(info.value)
    assert "MultiDiscrete([4 2])" in message and "IMPALA, A2C or A3C" in message


def test_unsupported_action_spaces_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="no action distribution for action space Dict"):
        dist_class_for(spaces.Dict({"a": spaces.Discrete(2)}))
    with pytest.raises(ValueError, match="MultiDiscrete action spaces must be 1-D"):
        dist_class_for(spaces.MultiDiscrete([[2, 2], [2, 2]]))


@pytest.mark.slow
async def test_impala_learns_a_dict_observation_task_with_multi_discrete_actions(tmp_path):
    """The cue task with Dict observations and MultiDiscrete actions, 2 worker processes:
    random play earns ~3.75 of 10; the run must reach 8.5 within the budget."""
    spec = get_algorithm("impala")
    config = load_config(spec.config_cls, {
        "env": ENV, "env_config": {"obs": "dict", "actions": "multidiscrete"},
        "num_workers": 2, "seed": 0, "min_iter_time_s": 1.0, "lr": 3e-3})
    history = []
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            for _ in range(40):
                result = await trainer.train()
                history.append((result["timesteps_total"],
                                round(result["episode_reward_mean"], 2)))
                if result["episode_reward_mean"] >= 8.5:
                    break
        finally:
            await trainer.stop()
    assert max(reward for _, reward in history) >= 8.5, history


def test_gym_flatten_is_what_workers_store() -> None:
    """The worker's obs column is gymnasium's flatten of what the env returned."""
    env = CueEnv("nested")
    raw, _ = env.reset(seed=3)
    worker = RolloutWorker(ENV, get_algorithm("a2c").policy, {
        "env_config": {"obs": "nested"}, "rollout_fragment_length": 1, "seed": 3})
    batch = worker.sample()
    np.testing.assert_array_equal(
        batch["obs"][0], gym.spaces.flatten(env.observation_space, raw).astype(np.float32))
