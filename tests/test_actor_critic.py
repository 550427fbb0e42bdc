"""Actor-critic policy: GAE against a slow reference, bootstrapping, the loss, gradient
equivalence, and single-process A2C learning CartPole."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.data.batch import SampleBatch
from actorrl.envs import EpisodeWindow
from actorrl.policy.action_dist import Categorical
from actorrl.policy.actor_critic import ActorCriticPolicy
from actorrl.policy.advantages import compute_advantages, discount_cumsum
from actorrl.rollout import RolloutWorker
from tests.helpers.configs import A2C_CARTPOLE

torch.set_num_threads(1)

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
SMALL_MODEL = {"fcnet_hiddens": [16, 16]}


def reference_advantages(rewards, values, last_value, gamma, lambda_, use_gae, use_critic):
    """Straight from the definitions, one double loop per quantity (slow on purpose)."""
    n = len(rewards)
    returns = []
    for t in range(n):
        total = 0.0
        for k in range(t, n):
            total += gamma ** (k - t) * rewards[k]
        total += gamma ** (n - t) * last_value
        returns.append(total)
    if not use_critic:
        return np.array(returns), np.zeros(n)
    if not use_gae:
        return np.array(returns) - np.array(values), np.array(returns)
    next_values = list(values[1:]) + [last_value]
    deltas = [rewards[t] + gamma * next_values[t] - values[t] for t in range(n)]
    advantages = []
    for t in range(n):
        advantages.append(sum((gamma * lambda_) ** (k - t) * deltas[k] for k in range(t, n)))
    return np.array(advantages), np.array(advantages) + np.array(values)


@pytest.mark.parametrize("length", [1, 2, 17, 100])
@pytest.mark.parametrize("gamma, lambda_", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.5), (0.0, 0.9)])
@pytest.mark.parametrize("use_gae, use_critic", [(True, True), (False, True), (False, False)])
def test_advantages_match_slow_reference(length, gamma, lambda_, use_gae, use_critic):
    rng = np.random.default_rng(length)
    rewards = rng.normal(size=length).astype(np.float32)
    values = rng.normal(size=length).astype(np.float32)
    last_value = float(rng.normal())
    advantages, targets = compute_advantages(rewards, values, last_value, gamma, lambda_,
                                             use_gae=use_gae, use_critic=use_critic)
    ref_adv, ref_targets = reference_advantages(rewards.tolist(), values.tolist(), last_value,
                                                gamma, lambda_, use_gae, use_critic)
    assert advantages.dtype == np.float32 and targets.dtype == np.float32
    np.testing.assert_allclose(advantages, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-4, atol=1e-4)


def test_discount_cumsum_small_case():
    np.testing.assert_allclose(discount_cumsum(np.array([1.0, 2.0, 3.0]), 0.5),
                               [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3])


def test_gae_without_critic_is_an_error():
    with pytest.raises(ValueError, match="use_gae=True needs use_critic=True"):
        compute_advantages(np.ones(3), None, 0.0, 0.99, 1.0, use_gae=True, use_critic=False)
    with pytest.raises(ValueError, match="use_gae=True needs use_critic=True"):
        ActorCriticPolicy(OBS_SPACE, ACTION_SPACE, {"use_critic": False})


def test_gamma_out_of_range_is_an_error():
    with pytest.raises(ValueError, match="gamma must be in \\[0, 1\\], got 1.5"):
        ActorCriticPolicy(OBS_SPACE, ACTION_SPACE, {"gamma": 1.5})


def make_policy(seed: int = 0, **config) -> ActorCriticPolicy:
    torch.manual_seed(seed)
    return ActorCriticPolicy(OBS_SPACE, ACTION_SPACE, {"model": SMALL_MODEL, **config})


def fragment(policy: ActorCriticPolicy, length: int, *, terminated: bool, truncated: bool,
             seed: int = 0) -> SampleBatch:
    """A trajectory fragment with the policy's own actions and value predictions."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (length + 1, 3)).astype(np.float32)
    actions, extras = policy.compute_actions(obs[:-1])
    flags = np.zeros(length, dtype=bool)
    return SampleBatch({
        SampleBatch.OBS: obs[:-1], SampleBatch.NEXT_OBS: obs[1:],
        SampleBatch.ACTIONS: actions,
        SampleBatch.REWARDS: rng.normal(size=length).astype(np.float32),
        SampleBatch.TERMINATEDS: np.append(flags[:-1], terminated),
        SampleBatch.TRUNCATEDS: np.append(flags[:-1], truncated),
        **extras,
    })


@pytest.mark.parametrize("terminated, truncated, bootstraps", [
    (True, False, False),   # episode ended: no value after the end
    (False, True, True),    # time limit: the state still had a future
    (False, False, True),   # fragment cut mid-episode
])
def test_postprocess_bootstraps_only_when_not_terminated(terminated, truncated, bootstraps):
    policy = make_policy(**{"lambda": 0.9})
    batch = fragment(policy, 6, terminated=terminated, truncated=truncated)
    last_value = float(policy.compute_values(batch[SampleBatch.NEXT_OBS][-1:])[0])
    assert abs(last_value) > 1e-4  # a zero bootstrap would make the test vacuous
    out = policy.postprocess_trajectory(batch.copy())
    expected_adv, expected_targets = reference_advantages(
        batch[SampleBatch.REWARDS].tolist(), batch[SampleBatch.VF_PREDS].tolist(),
        last_value if bootstraps else 0.0, 0.99, 0.9, True, True)
    np.testing.assert_allclose(out[SampleBatch.ADVANTAGES], expected_adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[SampleBatch.VALUE_TARGETS], expected_targets, rtol=1e-4,
                               atol=1e-5)


def test_compute_actions_extras_are_consistent():
    policy = make_policy()
    obs = np.random.default_rng(1).uniform(-1, 1, (5, 3)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    assert actions.shape == (5,) and actions.dtype == np.int64
    logits, values = policy.model(torch.as_tensor(obs))
    dist = Categorical(logits)
    np.testing.assert_allclose(extras[SampleBatch.ACTION_LOGP],
                               dist.logp(torch.as_tensor(actions)).detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(extras[SampleBatch.VF_PREDS], values.detach().numpy(), atol=1e-6)
    greedy, _ = policy.compute_actions(obs, explore=False)
    assert np.array_equal(greedy, logits.argmax(-1).numpy())


def test_loss_matches_formula():
    policy = make_policy(vf_loss_coeff=0.7, entropy_coeff=0.05)
    batch = policy.postprocess_trajectory(fragment(policy, 8, terminated=False, truncated=False))
    out = policy.loss(policy.model, policy.batch_to_tensors(batch))
    logits, values = policy.model(torch.as_tensor(batch[SampleBatch.OBS]))
    dist = torch.distributions.Categorical(logits=logits)
    logp = dist.log_prob(torch.as_tensor(batch[SampleBatch.ACTIONS]))
    adv = torch.as_tensor(batch[SampleBatch.ADVANTAGES])
    targets = torch.as_tensor(batch[SampleBatch.VALUE_TARGETS])
    expected = (-(logp * adv).mean() + 0.7 * 0.5 * ((values - targets) ** 2).mean()
                - 0.05 * dist.entropy().mean())
    assert torch.allclose(out.loss, expected, atol=1e-6)
    assert set(out.stats) == {"policy_loss", "vf_loss", "entropy", "vf_explained_var",
                              "total_loss", "cur_lr", "entropy_coeff"}


def test_pg_without_critic_has_no_value_loss():
    policy = make_policy(use_gae=False, use_critic=False)
    batch = policy.postprocess_trajectory(fragment(policy, 5, terminated=False, truncated=True))
    assert np.all(batch[SampleBatch.VALUE_TARGETS] == 0)
    out = policy.loss(policy.model, policy.batch_to_tensors(batch))
    assert "vf_loss" not in out.stats


def test_compute_and_apply_gradients_equal_learn_on_batch():
    """Gradients computed, shipped as numpy and applied give exactly the same update as
    learn_on_batch on the same batch (same optimizer, same clipping)."""
    a = make_policy(seed=3, grad_clip=0.1, lr=0.01)
    b = make_policy(seed=3, grad_clip=0.1, lr=0.01)
    batch = a.postprocess_trajectory(fragment(a, 12, terminated=True, truncated=False))
    for _ in range(3):
        grads, info = a.compute_gradients(batch)
        a.apply_gradients(grads)
        learn_info = b.learn_on_batch(batch)
        assert info["batch_count"] == 12
        assert info["learner_stats"]["grad_gnorm"] == pytest.approx(
            learn_info["learner_stats"]["grad_gnorm"], rel=1e-5)
        assert learn_info["learner_stats"]["grad_gnorm"] > 0.1  # clipping was active
    for name, value in a.get_weights().items():
        np.testing.assert_allclose(value, b.get_weights()[name], atol=1e-7, err_msg=name)


@pytest.mark.learning
def test_a2c_learns_cartpole():
    """Single-process A2C (sample from 8 vectorized envs, one update per batch) reaches a
    smoothed mean return of 150 on CartPole-v1 within 100k env steps."""
    env_steps_budget = 100_000
    worker = RolloutWorker("CartPole-v1", ActorCriticPolicy, {**A2C_CARTPOLE, "seed": 0})
    window = EpisodeWindow(smoothing_episodes=100)
    env_steps, summary, start = 0, {}, time.perf_counter()
    while env_steps < env_steps_budget:
        batch = worker.sample()
        env_steps += batch.count
        worker.learn_on_batch(batch)
        summary = window.update(worker.get_metrics())
        if summary["episode_reward_mean"] >= 150:
            break
    elapsed_s = time.perf_counter() - start
    worker.stop()
    assert summary["episode_reward_mean"] >= 150, (
        f"A2C reached only {summary['episode_reward_mean']:.1f} after {env_steps} env steps "
        f"({elapsed_s:.1f} s)")
