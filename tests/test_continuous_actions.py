"""Continuous actions as RLlib has them: ``normalize_actions`` (unsquash to the bounds),
``clip_actions``, ``free_log_std`` and the Gaussian's log-probability, each against a numpy
reference written here; retired env ids and the mujoco extra."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.data.actions import clip_action, env_actions, squash_action, unsquash_action
from actorrl.envs.retired import (
    RetiredEnvIdWarning,
    check_mujoco_installed,
    current_env_id,
    is_mujoco_id,
)
from actorrl.experiment.evaluate import action_options
from actorrl.policy.action_dist import DiagGaussian
from actorrl.policy.models import ActorCriticModel, FreeLogStdHead

pytestmark = pytest.mark.unit

BOX = gym.spaces.Box(np.array([-2.0, 0.0, 300.0], np.float32),
                     np.array([2.0, 1.0, 500.0], np.float32))


def reference_unsquash(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    out = np.empty_like(action, dtype=np.float64)
    for index in np.ndindex(action.shape):
        column = index[-1]
        value = low[column] + (action[index] + 1.0) / 2.0 * (high[column] - low[column])
        out[index] = min(max(value, low[column]), high[column])
    return out


def test_unsquash_maps_minus_one_one_onto_the_bounds_and_clips():
    actions = np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.5, -0.5],
                        [3.0, -7.0, 1.5]], np.float32)
    got = unsquash_action(actions, BOX)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference_unsquash(actions, BOX.low, BOX.high), rtol=1e-6)
    np.testing.assert_allclose(got[0], BOX.low)
    np.testing.assert_allclose(got[1], BOX.high)
    np.testing.assert_allclose(got[3], [2.0, 0.0, 500.0])  # outside [-1, 1]: clipped


def test_squash_inverts_unsquash_inside_the_bounds():
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (50, 3)).astype(np.float32)
    np.testing.assert_allclose(squash_action(unsquash_action(actions, BOX), BOX), actions,
                               atol=1e-5)


def test_integer_box_is_shifted_and_unbounded_box_passes():
    ints = gym.spaces.Box(3, 9, (2,), np.int64)
    np.testing.assert_array_equal(unsquash_action(np.array([[0, 6]]), ints), [[3, 9]])
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    actions = np.array([[5.0, -5.0]], np.float32)
    assert unsquash_action(actions, unbounded) is actions
    np.testing.assert_array_equal(clip_action(actions, gym.spaces.Box(-1, 1, (2,))),
                                  [[1.0, -1.0]])


def test_env_actions_modes():
    discrete = env_actions(gym.spaces.Discrete(3), np.array([2, 0]), normalize=True,
                           clip=True)
    assert discrete == [2, 0] and all(isinstance(a, int) for a in discrete)
    actions = np.array([[0.0, 0.0, 0.0], [5.0, 5.0, 5.0]], np.float32)
    np.testing.assert_allclose(env_actions(BOX, actions, normalize=True, clip=False),
                               [[0.0, 0.5, 400.0], [2.0, 1.0, 500.0]])
    np.testing.assert_allclose(env_actions(BOX, actions, normalize=False, clip=True),
                               [[0.0, 0.0, 300.0], [2.0, 1.0, 300.0]])
    assert env_actions(BOX, actions, normalize=False, clip=False) is actions


def test_checkpoints_without_normalize_actions_evaluate_as_they_trained():
    assert action_options({}) == {"normalize": False, "clip": True}
    assert action_options({"rollout": {"normalize_actions": True, "clip_actions": False}}) \
        == {"normalize": True, "clip": False}


def test_diag_gaussian_logp_entropy_kl_against_numpy():
    rng = np.random.default_rng(1)
    mean, log_std = rng.normal(size=(4, 2)), rng.normal(size=(4, 2)) * 0.5
    actions = rng.normal(size=(4, 2)) * 3
    dist = DiagGaussian(torch.as_tensor(np.concatenate([mean, log_std], -1)))
    std = np.exp(log_std)
    ref_logp = (-0.5 * ((actions - mean) / std) ** 2 - log_std
                - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(dist.logp(torch.as_tensor(actions)).numpy(), ref_logp,
                               rtol=1e-6)
    np.testing.assert_allclose(dist.entropy().numpy(),
                               (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1),
                               rtol=1e-6)
    mean2, log_std2 = mean + 0.3, log_std - 0.2
    other = DiagGaussian(torch.as_tensor(np.concatenate([mean2, log_std2], -1)))
    std2 = np.exp(log_std2)
    ref_kl = (log_std2 - log_std + (std ** 2 + (mean - mean2) ** 2) / (2 * std2 ** 2)
              - 0.5).sum(-1)
    np.testing.assert_allclose(dist.kl(other).numpy(), ref_kl, rtol=1e-5)


def test_free_log_std_is_one_learned_vector_for_every_observation():
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    model = ActorCriticModel(obs_space, action_space, 4,
                             {"fcnet_hiddens": [8], "free_log_std": True})
    assert isinstance(model.policy_head, FreeLogStdHead)
    with torch.no_grad():
        model.policy_head.log_std.copy_(torch.tensor([0.5, -1.0]))
    obs = torch.randn(5, 3)
    outputs, values = model(obs)
    assert outputs.shape == (5, 4) and values.shape == (5,)
    np.testing.assert_allclose(outputs[:, 2:].detach().numpy(), [[0.5, -1.0]] * 5)
    assert outputs[:, :2].std(0).min() > 0  # the means depend on the observation
    DiagGaussian(outputs).logp(torch.zeros(5, 2)).sum().backward()
    assert model.policy_head.log_std.grad is not None
    assert model.policy_head.log_std.grad.abs().min() > 0
    plain = ActorCriticModel(obs_space, action_space, 4, {"fcnet_hiddens": [8]})
    assert not isinstance(plain.policy_head, FreeLogStdHead)
    with pytest.raises(ValueError, match="free_log_std"):
        ActorCriticModel(obs_space, gym.spaces.Discrete(3), 3,
                         {"fcnet_hiddens": [8], "free_log_std": True})


def test_retired_ids_run_as_their_current_versions_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert current_env_id("HalfCheetah-v2") == "HalfCheetah-v5"
        assert current_env_id("HalfCheetah-v2") == "HalfCheetah-v5"
        assert current_env_id("Humanoid-v3") == "Humanoid-v5"
        assert current_env_id("Pendulum-v0") == "Pendulum-v1"
    retired = [w for w in caught if issubclass(w.category, RetiredEnvIdWarning)]
    assert [str(w.message).split("'")[1] for w in retired] == [
        "HalfCheetah-v2", "Humanoid-v3", "Pendulum-v0"]
    assert "HalfCheetah-v5" in str(retired[0].message)
    for current in ("HalfCheetah-v4", "Hopper-v5", "CartPole-v1", "Pendulum-v1"):
        assert current_env_id(current) == current
    assert is_mujoco_id("Walker2d-v3") and not is_mujoco_id("CartPole-v1")


def test_mujoco_ids_without_the_extra_name_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mujoco" else real(name, *a))
    with pytest.raises(ValueError, match=r"mujoco extra.*\.\[mujoco\]"):
        check_mujoco_installed("Hopper-v5")
    check_mujoco_installed("CartPole-v1")


def test_rllib_mujoco_ids_build_as_gymnasium_v5_envs():
    from tests.helpers.extras import installed

    if not installed("mujoco"):
        pytest.skip('the mujoco extra is not installed (pip install -e ".[mujoco]")')
    from actorrl.envs.make import make_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RetiredEnvIdWarning)
        env = make_env("HalfCheetah-v3")
    try:
        assert env.spec.id == "HalfCheetah-v5"
        assert env.action_space.shape == (6,) and env.observation_space.shape == (17,)
        obs, _ = env.reset(seed=0)
        obs, reward, terminated, truncated, _ = env.step(
            unsquash_action(np.ones(6, np.float32), env.action_space))
        assert np.isfinite(reward) and obs.shape == (17,)
    finally:
        env.close()


def test_normalized_gaussian_clamps_its_log_std_and_the_loss_follows():
    from actorrl.policy.action_dist import (
        LOG_STD_MAX,
        LOG_STD_MIN,
        NormalizedDiagGaussian,
        dist_class_for,
    )

    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    assert dist_class_for(space, normalize_actions=True) is NormalizedDiagGaussian
    assert dist_class_for(space) is DiagGaussian
    assert dist_class_for(gym.spaces.Box(-np.inf, np.inf, (1,)), True) is DiagGaussian
    inputs = torch.tensor([[0.2, 5.0], [0.2, -30.0], [0.2, 0.5]], requires_grad=True)
    dist = NormalizedDiagGaussian(inputs)
    log_std = np.clip([5.0, -30.0, 0.5], LOG_STD_MIN, LOG_STD_MAX)
    actions = np.array([[0.9], [0.2], [-0.4]])
    ref = -0.5 * ((actions[:, 0] - 0.2) / np.exp(log_std)) ** 2 - log_std \
        - 0.5 * math.log(2 * math.pi)
    logp = dist.logp(torch.as_tensor(actions, dtype=torch.float32))
    np.testing.assert_allclose(logp.detach().numpy(), ref, rtol=1e-5)
    logp.sum().backward()
    # past the bounds the log-std output gets no gradient: nothing walks it further
    assert inputs.grad[0, 1] == 0 and inputs.grad[1, 1] == 0 and inputs.grad[2, 1] != 0


def _bang_bang_batch(policy, rows: int, rng: np.random.Generator):
    """One step of a bandit whose reward is |clip(action)|: the best the env can see is a
    bound, so a wider Gaussian is always at least as good (the flat direction of a
    clipped Gaussian, as in Pendulum's swing-up)."""
    from actorrl.data.batch import SampleBatch

    obs = rng.normal(size=(rows, 2)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    rewards = np.abs(np.clip(actions[:, 0], -1.0, 1.0))
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    return SampleBatch({SampleBatch.OBS: obs, SampleBatch.ACTIONS: actions,
                        SampleBatch.ADVANTAGES: advantages.astype(np.float32),
                        SampleBatch.VALUE_TARGETS: np.zeros(rows, np.float32), **extras})


@pytest.mark.parametrize("normalize", [False, True])
def test_a_clipped_gaussian_runs_away_only_without_the_bound(normalize):
    """The runaway of RLlib's pendulum-ppo file on a small budget: PPO's loss on a
    bandit where a bound is the best action drives the state-dependent log-std far past
    the range in some states within 100 updates (unbounded: above 5, a standard deviation
    of 150 on a [-1, 1] range); with normalised actions the distribution the loss and the
    sampler use never passes LOG_STD_MAX, and the policy reaches the bound through its
    mean instead."""
    from actorrl.config.loading import load_component
    from actorrl.policy.action_dist import LOG_STD_MAX
    from actorrl.policy.config import PPOPolicyConfig
    from actorrl.policy.ppo import PPOPolicy

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    config = load_component(PPOPolicyConfig, {
        "model": {"fcnet_hiddens": [16]}, "lr": 1e-2, "grad_clip": None, "kl_coeff": 0.0},
        section="policy").replace(normalize_actions=normalize)  # as a rollout worker sets it
    policy = PPOPolicy(gym.spaces.Box(-5, 5, (2,), np.float32),
                       gym.spaces.Box(-1, 1, (1,), np.float32), config)
    for _ in range(100):
        policy.learn_on_batch(_bang_bang_batch(policy, 256, rng))
    obs = torch.as_tensor(rng.normal(size=(512, 2)).astype(np.float32))
    with torch.no_grad():
        dist = policy.dist_class(policy.model(obs)[0])
    if normalize:
        assert dist.log_std.max() <= LOG_STD_MAX
        assert dist.mean.abs().mean() > 1.0  # bang-bang through the mean
    else:
        assert dist.log_std.max() > 5.0, dist.log_std.max()
