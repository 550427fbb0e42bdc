"""Action masks (RLlib's ``action_mask`` / ``observations`` Dict): masked actions are never
sampled, explored or greedy, masked logits get no gradient, masked Q-values are never a
target; recurrent models and the multi-tower learner keep working."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.data.batch import SampleBatch
from actorrl.data.spaces import observation_preprocessor
from actorrl.envs.custom.masked import PickBest
from actorrl.learner.towers import TowerSet
from actorrl.policy.action_masking import (
    FLOAT_MIN,
    ActionMaskLayout,
    MaskedModel,
    MaskedRecurrentModel,
    mask_outputs,
)
from actorrl.policy.dqn import DQNPolicy
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver

ENV = "actorrl.envs.custom.masked:pick_best"
CATEGORICAL = {
    "ppo": "actorrl.policy.ppo:PPOPolicy",
    "impala": "actorrl.policy.impala:ImpalaPolicy",
    "appo": "actorrl.policy.appo:APPOPolicy",
    "a2c": "actorrl.policy.actor_critic:ActorCriticPolicy",
}
DQN = "actorrl.policy.dqn:DQNPolicy"
SMALL = {"num_envs_per_worker": 4, "rollout_fragment_length": 25,
         "model": {"fcnet_hiddens": [16]}}
ALWAYS_EXPLORE = {"exploration_config": {"initial_epsilon": 1.0, "final_epsilon": 1.0}}


def _worker(policy: str, **config) -> RolloutWorker:
    return RolloutWorker(ENV, policy, {**SMALL, "seed": 5, **config})


def _legal(policy, obs: np.ndarray) -> np.ndarray:
    layout = ActionMaskLayout.of(policy.observation_space)
    assert layout is not None
    return layout.legal(obs)


def _flat(space: gym.Space, mask: list[float], values: list[float]) -> np.ndarray:
    prep = observation_preprocessor(space)
    assert prep is not None
    return prep({"action_mask": np.asarray(mask, np.float32),
                 "observations": np.asarray(values, np.float32)})


# ---- the layout --------------------------------------------------------------------------
def test_layout_finds_the_mask_and_the_observations_in_the_flat_vector():
    space = PickBest(num_actions=4).observation_space
    layout = ActionMaskLayout.of(space)
    assert layout is not None and layout.mask_size == 4 and layout.obs_size == 4
    flat = torch.as_tensor(_flat(space, [0, 1, 0, 1], [0.1, 0.2, 0.3, 0.4]))[None]
    inner, mask = layout.split(flat)
    assert mask.tolist() == [[0, 1, 0, 1]]
    np.testing.assert_allclose(inner.numpy(), [[0.1, 0.2, 0.3, 0.4]], rtol=1e-6)
    assert ActionMaskLayout.of(gym.spaces.Box(0, 1, (3,))) is None
    assert ActionMaskLayout.of(gym.spaces.Dict({"a": gym.spaces.Discrete(2)})) is None


def test_layout_refuses_spaces_off_the_convention_saying_what_to_do():
    box = gym.spaces.Box(0, 1, (3,))
    with pytest.raises(ValueError, match="exactly the keys 'action_mask' and 'observations'"):
        ActionMaskLayout.of(gym.spaces.Dict({"action_mask": box, "obs": box}))
    with pytest.raises(ValueError, match="1-D Box or a MultiBinary"):
        ActionMaskLayout.of(gym.spaces.Dict({"action_mask": gym.spaces.Discrete(3),
                                             "observations": box}))
    space = gym.spaces.Dict({"action_mask": box, "observations": box})
    with pytest.raises(ValueError, match="has 3 entries but action space Discrete"):
        DQNPolicy(space, gym.spaces.Discrete(4), {})


def test_masked_outputs_are_the_float32_minimum_and_an_all_zero_row_is_left_alone():
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    out = mask_outputs(logits, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert out[0, 1].item() == pytest.approx(FLOAT_MIN, rel=1e-6)
    assert out[0, [0, 2]].tolist() == [1.0, 3.0]
    assert out[1].tolist() == [1.0, 2.0, 3.0]
    assert torch.isfinite(torch.log_softmax(out, -1)).all()


# ---- categorical policies ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CATEGORICAL))
def test_categorical_policies_never_sample_a_masked_action(name):
    """Sampling (the env raises on a masked action) and the greedy mode; the model sees the
    observations only."""
    worker = _worker(CATEGORICAL[name])
    policy = worker.get_policy()
    assert isinstance(policy.model, MaskedModel)
    batch = SampleBatch.concat_samples([worker.sample() for _ in range(3)])
    legal = _legal(policy, batch[SampleBatch.OBS])
    assert not legal.all()  # some actions were masked
    assert legal[np.arange(batch.count), batch[SampleBatch.ACTIONS]].all()
    # a masked action has probability 0 in the stored distribution
    logp = torch.log_softmax(torch.as_tensor(batch[SampleBatch.ACTION_DIST_INPUTS]), -1)
    assert (logp.exp()[torch.as_tensor(~legal)] == 0).all()
    greedy, _ = policy.compute_actions(batch[SampleBatch.OBS], explore=False)
    assert legal[np.arange(batch.count), greedy].all()


@pytest.mark.parametrize("name", sorted(CATEGORICAL))
def test_masked_logits_get_no_gradient(name):
    """The inner model's logits at masked actions get exactly zero gradient from the whole
    loss (policy, entropy, KL terms); legal ones do get some; every gradient is finite."""
    worker = _worker(CATEGORICAL[name])
    policy = worker.get_policy()
    batch = worker.sample()
    captured: list[torch.Tensor] = []

    def keep_logits(_module, _inputs, outputs):
        if outputs[0].requires_grad:  # not an old policy's or target's forward
            outputs[0].retain_grad()
            captured.append(outputs[0])

    handle = policy.model.inner.register_forward_hook(keep_logits)
    try:
        policy.model.train()
        out = policy.loss(policy.model, policy.batch_to_tensors(batch))
        out.loss.backward()
    finally:
        handle.remove()
    legal = torch.as_tensor(_legal(policy, batch[SampleBatch.OBS]))
    grads = [c.grad for c in captured if c.grad is not None and c.shape[0] == batch.count]
    assert grads
    for grad in grads:
        assert torch.isfinite(grad).all()
        assert (grad[~legal] == 0).all()
    assert any((grad[legal] != 0).any() for grad in grads)
    assert all(torch.isfinite(p.grad).all() for p in policy.model.parameters()
               if p.grad is not None)


def test_a_recurrent_policy_masks_every_step_and_learns_with_finite_gradients():
    worker = _worker(CATEGORICAL["ppo"], model={"use_lstm": True, "lstm_cell_size": 8,
                                                "fcnet_hiddens": [8], "max_seq_len": 5})
    policy = worker.get_policy()
    assert isinstance(policy.model, MaskedRecurrentModel) and policy.is_recurrent
    batch = worker.sample()
    assert SampleBatch.SEQ_LENS in batch
    legal = _legal(policy, batch[SampleBatch.OBS])
    assert legal[np.arange(batch.count), batch[SampleBatch.ACTIONS]].all()
    before = [p.detach().clone() for p in policy.model.parameters()]
    info = policy.learn_on_batch(batch)
    assert np.isfinite(info["learner_stats"]["total_loss"])
    after = list(policy.model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_masked_impala_on_two_towers_equals_the_one_device_update():
    torch.manual_seed(0)
    config = {**SMALL, "lr": 1e-2}
    batch = SampleBatch.concat_samples([_worker(CATEGORICAL["impala"]).sample()
                                        for _ in range(2)]).slice(0, 100)
    reference = _worker(CATEGORICAL["impala"], **config).get_policy()
    towered = _worker(CATEGORICAL["impala"], **config).get_policy()
    towered.set_weights(reference.get_weights())
    reference.learn_on_batch(batch)
    towers = TowerSet(towered, [torch.device("cpu")] * 2, num_stacks=1)
    towers.load(batch, 0)
    towers.learn_on_loaded(0)
    for a, b in zip(reference.model.parameters(), towered.model.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


# ---- DQN / Ape-X -------------------------------------------------------------------------
def test_dqn_explores_among_legal_actions_only_and_acts_greedily_among_them():
    worker = _worker(DQN, **ALWAYS_EXPLORE)
    policy = worker.get_policy()
    batch = SampleBatch.concat_samples([worker.sample() for _ in range(4)])
    legal = _legal(policy, batch[SampleBatch.OBS])
    actions = batch[SampleBatch.ACTIONS]
    assert legal[np.arange(batch.count), actions].all()
    # uniform among the legal ones: every action is taken somewhere, none where masked
    assert set(actions.tolist()) == set(range(policy.action_space.n))
    greedy, _ = policy.compute_actions(batch[SampleBatch.OBS], explore=False)
    assert legal[np.arange(batch.count), greedy].all()


def test_dqn_random_actions_follow_a_single_legal_action():
    policy = _worker(DQN, **ALWAYS_EXPLORE).get_policy()
    space = policy.observation_space
    obs = np.stack([_flat(space, [0, 0, 1, 0, 0, 0], [0.9] * 6)] * 200)
    actions, _ = policy.compute_actions(obs, explore=True)
    assert (actions == 2).all()


@pytest.mark.parametrize("double_q", [True, False])
def test_a_masked_q_value_is_never_a_target(double_q):
    """The target network's Q-values favour action 0 by far; action 0 is masked in the
    next observation, so the target is the max over the legal actions."""
    policy = _worker(DQN, double_q=double_q, n_step=1, gamma=0.5).get_policy()
    for model in (policy.model, policy.target_model):
        head = model.inner.advantage[-1]
        with torch.no_grad():
            head.weight.zero_()
            head.bias.copy_(torch.tensor([100.0, 1.0, 2.0, 3.0, 4.0, 5.0]))
        if model.inner.value is not None:
            with torch.no_grad():
                model.inner.value[-1].weight.zero_()
                model.inner.value[-1].bias.zero_()
    space = policy.observation_space
    obs = _flat(space, [1, 1, 1, 1, 1, 1], [0.5] * 6)
    next_obs = _flat(space, [0, 1, 1, 0, 0, 0], [0.5] * 6)
    batch = SampleBatch({
        SampleBatch.OBS: obs[None], SampleBatch.NEXT_OBS: next_obs[None],
        SampleBatch.ACTIONS: np.array([1]), SampleBatch.REWARDS: np.array([1.0], np.float32),
        SampleBatch.TERMINATEDS: np.array([False]),
    })
    td_error, _ = policy._td_error(policy.model, policy.batch_to_tensors(batch))
    q_selected = policy.model(torch.as_tensor(obs[None]))[0, 1].detach()
    dueling_shift = 0.0 if policy.model.inner.value is None else -np.mean(
        [100.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    best_legal = 2.0 + dueling_shift  # action 2: the best of the legal 1 and 2
    expected_target = 1.0 + 0.5 * best_legal
    assert float(q_selected - td_error[0]) == pytest.approx(expected_target, rel=1e-5)
    info = policy.learn_on_batch(batch)
    assert all(np.isfinite(v) for v in info["learner_stats"].values())
    assert info["learner_stats"]["max_q"] < 1e30 and info["learner_stats"]["min_q"] > -1e30


# ---- through the distributed pipelines ----------------------------------------------------
RANDOM_LEGAL_RETURN = 5.0
"""PickBest's return per 10-step episode with a uniformly random legal action (best: 7.6)."""
LEARNED_RETURN = 6.5
STEP_BUDGET = 1_000_000
"""Env steps each algorithm gets to learn it (here Ape-X took 9k, PPO 18k, IMPALA 366k;
bounded by steps: a slow machine's shorter iterations must not cut the run short)."""


@pytest.mark.learning
@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["apex", "ppo", "impala"])
async def test_masked_training_through_the_pipeline_learns_pick_best(algorithm, tmp_path):
    """Workers, replay shards and the learner as processes: PickBest raises on a masked
    action, and an env error fails the training iteration (checked by hand for PPO and
    Ape-X), so every action of the run was legal; the policy learns the best legal action
    well above a random legal choice."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"env": ENV, "num_workers": 1, "seed": 0,
                                           "min_iter_time_s": 0.5})
    history = []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            while True:
                result = await trainer.train()
                history.append(round(float(result["episode_reward_mean"]), 2))
                assert result["num_healthy_workers"] == 1
                if result["episode_reward_mean"] >= LEARNED_RETURN \
                        or result["timesteps_total"] >= STEP_BUDGET:
                    break
        finally:
            await trainer.stop()
    assert result["episode_reward_mean"] >= LEARNED_RETURN > RANDOM_LEGAL_RETURN, history


def test_multi_discrete_actions_are_masked_per_component():
    """A MultiDiscrete([3, 2]) mask has 3 + 2 entries, the components side by side: a PPO
    policy and RandomPolicy choose only legal values of each component."""
    from actorrl.policy.ppo import PPOPolicy
    from actorrl.policy.random_policy import RandomPolicy

    space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(5),
                             "observations": gym.spaces.Box(-1, 1, (2,), np.float32)})
    actions_space = gym.spaces.MultiDiscrete([3, 2])
    prep = observation_preprocessor(space)
    obs = np.stack([prep({"action_mask": np.array([0, 0, 1, 1, 0], np.int8),
                          "observations": np.zeros(2, np.float32)})] * 300)
    for policy in (PPOPolicy(space, actions_space, {"model": {"fcnet_hiddens": [8]}}),
                   RandomPolicy(space, actions_space, {})):
        actions, _ = policy.compute_actions(obs, explore=True)
        assert actions.shape == (300, 2)
        assert (actions[:, 0] == 2).all() and (actions[:, 1] == 0).all()
