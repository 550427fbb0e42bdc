"""APPO: the clipped surrogate on V-trace advantages against the old (target) policy, the
KL term, the GAE path (``vtrace: false``), the old policy's sync period, the adaptive KL
coefficient, checkpoints, towers, and training through the Trainer and the CLI.

The loss checks compare the policy's loss with a numpy reference written here, computed
from the same network outputs (the test only borrows the forward passes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.data.batch import SampleBatch
from actorrl.learner.towers import TowerSet
from actorrl.policy.appo import APPOPolicy
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver

REPO = Path(__file__).resolve().parent.parent
APPO_POLICY = "actorrl.policy.appo:APPOPolicy"
FRAGMENT = 16
GAMMA = 0.9
CONFIG = {
    "num_envs_per_worker": 4, "rollout_fragment_length": FRAGMENT, "lr": 1e-2,
    "gamma": GAMMA, "grad_clip": 40.0, "clip_param": 0.2, "vf_loss_coeff": 0.7,
    "entropy_coeff": 0.05,
    "model": {"fcnet_hiddens": [16, 16], "fcnet_activation": "tanh"},
}


# ---- helpers -----------------------------------------------------------------------------
def _policy(config: dict, seed: int = 3) -> APPOPolicy:
    policy = RolloutWorker("CartPole-v1", APPO_POLICY, {**config, "seed": seed}).get_policy()
    assert isinstance(policy, APPOPolicy)
    return policy


def _sample(config: dict, rows: int, seed: int = 11) -> SampleBatch:
    worker = RolloutWorker("CartPole-v1", APPO_POLICY, {**config, "seed": seed})
    batches = []
    while sum(b.count for b in batches) < rows:
        batches.append(worker.sample())
    batch = SampleBatch.concat_samples(batches).slice(0, rows)
    # A behaviour policy far from the learner's: importance ratios on both sides of clips.
    rng = np.random.default_rng(0)
    batch["action_logp"] = np.log(rng.uniform(0.1, 0.95, batch.count)).astype(np.float32)
    return batch


def _perturb(model: torch.nn.Module, scale: float = 0.3) -> None:
    """Move a network's weights by a fixed random step."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def _perturb_old_policy(policy: APPOPolicy) -> None:
    """Make the old policy differ from the learner's (as after a few updates)."""
    _perturb(policy.target_model(policy.model))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _outputs(model: torch.nn.Module, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        logits, values = model(torch.as_tensor(obs))
    return logits.double().numpy(), values.double().numpy()


def _vtrace_reference(batch: SampleBatch, values: np.ndarray, next_values: np.ndarray,
                      log_rhos: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """V-trace by its backward recursion, written plainly: rho-bar = c-bar = pg-rho-bar = 1.
    A trace is cut after a terminal row (no bootstrap), after a time-limit truncation, where
    the episode changes and at every fragment end (bootstrap from V(new_obs))."""
    n = batch.count
    rhos = np.exp(log_rhos)
    clipped = np.minimum(1.0, rhos)
    terminated = batch["terminateds"].astype(bool)
    cut = terminated | batch["truncateds"].astype(bool)
    cut[:-1] |= batch["eps_id"][1:] != batch["eps_id"][:-1]
    cut |= (np.arange(n) % FRAGMENT) == FRAGMENT - 1
    vs = np.zeros(n)
    adv = np.zeros(n)
    for t in range(n - 1, -1, -1):
        if cut[t]:
            next_v = 0.0 if terminated[t] else next_values[t]
            next_vs, carry = next_v, 0.0
        else:
            next_v, next_vs, carry = values[t + 1], vs[t + 1], vs[t + 1] - values[t + 1]
        r = batch["rewards"][t]
        vs[t] = values[t] + clipped[t] * (r + gamma * next_v - values[t]) + \
            gamma * clipped[t] * carry
        adv[t] = clipped[t] * (r + gamma * next_vs - values[t])
    return vs, adv


def _surrogate(adv: np.ndarray, ratio: np.ndarray, clip: float) -> np.ndarray:
    return np.minimum(adv * ratio, adv * np.clip(ratio, 1 - clip, 1 + clip))


def _categorical_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def _reference_loss(policy: APPOPolicy, batch: SampleBatch, use_kl_loss: bool,
                    kl_coeff: float) -> dict[str, float]:
    """APPO's loss on ``batch`` in numpy from the networks' outputs."""
    cfg = CONFIG
    logits, values = _outputs(policy.model, batch["obs"])
    old_logits, _ = _outputs(policy.target_model(policy.model), batch["obs"])
    _, next_values = _outputs(policy.model, batch["new_obs"])
    actions = batch["actions"].astype(int)
    rows = np.arange(batch.count)
    logp = _log_softmax(logits)[rows, actions]
    old_logp = _log_softmax(old_logits)[rows, actions]
    mu_logp = batch["action_logp"].astype(np.float64)
    vs, adv = _vtrace_reference(batch, values, next_values, old_logp - mu_logp, GAMMA)
    ratio = np.clip(np.exp(mu_logp - old_logp), 0.0, 2.0) * np.exp(logp - mu_logp)
    policy_loss = -_surrogate(adv, ratio, cfg["clip_param"]).mean()
    vf_loss = 0.5 * ((values - vs) ** 2).mean()
    probs = np.exp(_log_softmax(logits))
    entropy = -(probs * _log_softmax(logits)).sum(axis=1).mean()
    kl = _categorical_kl(old_logits, logits).mean()
    total = policy_loss + cfg["vf_loss_coeff"] * vf_loss - cfg["entropy_coeff"] * entropy
    if use_kl_loss:
        total += kl_coeff * kl
    return {"policy_loss": policy_loss, "vf_loss": vf_loss, "total_loss": total, "kl": kl}


# ---- the loss ----------------------------------------------------------------------------
@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_vtrace_surrogate_and_kl_term_match_a_numpy_reference(use_kl_loss):
    """V-trace runs against the old policy (not the learner's), the ratio is
    clip(mu / pi_old, 0, 2) * pi / mu, and the KL term is KL(pi_old || pi) x kl_coeff."""
    config = {**CONFIG, "use_kl_loss": use_kl_loss, "kl_coeff": 0.7}
    policy = _policy(config)
    _perturb_old_policy(policy)
    batch = _sample(config, 8 * FRAGMENT)
    assert batch["terminateds"].any()  # episodes end inside the fragments
    expected = _reference_loss(policy, batch, use_kl_loss, 0.7)
    out = policy.loss(policy.model, policy.batch_to_tensors(batch))
    for key, value in expected.items():
        assert float(out.stats[key]) == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert float(out.loss.detach()) == pytest.approx(expected["total_loss"], rel=1e-4, abs=1e-6)
    # The old policy matters: were V-trace or the ratio taken against the learner's policy,
    # the reference (old != learner) would disagree by far more than the tolerance.
    assert expected["kl"] > 1e-3


def test_gae_path_uses_worker_advantages_and_the_behaviour_ratio():
    """``vtrace: false``: the worker adds GAE(lambda) advantages and value targets
    (numpy reference), the ratio is pi / mu and the KL is KL(mu || pi)."""
    config = {**CONFIG, "vtrace": False, "lambda": 0.8, "use_kl_loss": True, "kl_coeff": 0.5}
    worker = RolloutWorker("CartPole-v1", APPO_POLICY, {**config, "num_envs_per_worker": 1,
                                                       "seed": 4})
    batch = worker.sample()
    assert "vf_preds" in batch and "advantages" in batch
    policy = worker.get_policy()
    # GAE of the first trajectory of the fragment, by hand.
    ends = np.flatnonzero(batch["terminateds"] | batch["truncateds"])
    stop = int(ends[0]) + 1 if len(ends) else batch.count
    rewards, values = batch["rewards"][:stop], batch["vf_preds"][:stop].astype(np.float64)
    last = 0.0 if len(ends) and batch["terminateds"][stop - 1] else float(
        _outputs(policy.model, batch["new_obs"][stop - 1:stop])[1][0])
    next_values = np.append(values[1:], last)
    deltas = rewards + GAMMA * next_values - values
    adv = np.zeros(stop)
    running = 0.0
    for t in range(stop - 1, -1, -1):
        running = deltas[t] + GAMMA * 0.8 * running
        adv[t] = running
    np.testing.assert_allclose(batch["advantages"][:stop], adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch["value_targets"][:stop], adv + values, rtol=1e-4,
                               atol=1e-5)
    # The loss on a learner whose weights moved away from the behaviour policy's.
    learner = _policy(config, seed=9)
    _perturb(learner.model)
    logits, cur_values = _outputs(learner.model, batch["obs"])
    rows = np.arange(batch.count)
    logp = _log_softmax(logits)[rows, batch["actions"].astype(int)]
    ratio = np.exp(logp - batch["action_logp"])
    policy_loss = -_surrogate(batch["advantages"], ratio, CONFIG["clip_param"]).mean()
    vf_loss = 0.5 * ((cur_values - batch["value_targets"]) ** 2).mean()
    kl = _categorical_kl(batch["action_dist_inputs"].astype(np.float64), logits).mean()
    out = learner.loss(learner.model, learner.batch_to_tensors(batch))
    assert float(out.stats["policy_loss"]) == pytest.approx(policy_loss, rel=1e-4, abs=1e-6)
    assert float(out.stats["vf_loss"]) == pytest.approx(vf_loss, rel=1e-4, abs=1e-6)
    assert float(out.stats["kl"]) == pytest.approx(kl, rel=1e-4, abs=1e-6)
    assert kl > 1e-3


# ---- the old policy and the KL coefficient -----------------------------------------------
def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_old_policy_syncs_every_num_sgd_iter_times_buffer_updates():
    """RLlib's period: num_sgd_iter x minibatch_buffer_size learner updates (2 x 3 = 6);
    between syncs the old policy stays where it was."""
    spec = get_algorithm("appo")
    config = load_config(spec.config_cls, {**CONFIG, "num_sgd_iter": 2,
                                            "minibatch_buffer_size": 3})
    policy_config = config.component("policy")
    assert policy_config.target_update_period == 6
    policy = APPOPolicy(*_spaces(), policy_config)
    batch = _sample(CONFIG, 4 * FRAGMENT)
    start = {k: v.clone() for k, v in policy.target_model(policy.model).state_dict().items()}
    for update in range(1, 7):
        policy.learn_on_batch(batch)
        target = policy.target_model(policy.model)
        if update < 6:
            assert policy.num_target_updates == 0
            assert all(torch.equal(v, target.state_dict()[k]) for k, v in start.items())
            assert not _weights_equal(target, policy.model)
    assert policy.num_target_updates == 1 and _weights_equal(target, policy.model)


def _spaces():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space


@pytest.mark.parametrize("kl_target,factor", [(1e-9, 1.5), (1e3, 0.5)])
def test_kl_coeff_adapts_at_each_sync_and_survives_a_checkpoint(kl_target, factor):
    """With use_kl_loss the coefficient goes x1.5 when the KL is above twice the target and
    x0.5 below half of it, once per sync; get_state/set_state keep it and the old policy."""
    config = {**CONFIG, "use_kl_loss": True, "kl_coeff": 0.4, "kl_target": kl_target}
    policy = _policy(config)
    _perturb_old_policy(policy)
    batch = _sample(config, 4 * FRAGMENT)
    policy.learn_on_batch(batch)  # period 1 (num_sgd_iter 1 x buffer 1): one sync
    assert policy.kl_coeff == pytest.approx(0.4 * factor)
    _perturb_old_policy(policy)  # a synced old policy is the learner's: KL 0 at the next update
    stats = policy.learn_on_batch(batch)["learner_stats"]
    assert stats["KL_Coeff"] == pytest.approx(0.4 * factor)  # the loss used the new value
    assert policy.kl_coeff == pytest.approx(0.4 * factor * factor)
    _perturb_old_policy(policy)
    state = policy.get_state()
    restored = _policy(config, seed=8)
    restored.set_state(state)
    assert restored.kl_coeff == pytest.approx(policy.kl_coeff)
    assert restored.num_target_updates == policy.num_target_updates == 2
    assert _weights_equal(restored.target_model(restored.model),
                          policy.target_model(policy.model))
    assert not _weights_equal(restored.target_model(restored.model), restored.model)


def test_bad_appo_settings_are_refused_naming_the_key():
    """Every range is checked with the key's name in the message."""
    spec = get_algorithm("appo")
    for key, value in [("clip_param", 0.0), ("kl_target", 0.0), ("lambda", 1.5),
                       ("target_update_frequency", -1)]:
        with pytest.raises(ConfigError, match=key):
            load_config(spec.config_cls, {key: value})


# ---- towers ------------------------------------------------------------------------------
@pytest.mark.parametrize("num_towers", [2, 4])
def test_appo_on_towers_equals_the_one_device_update(num_towers):
    """N CPU towers (each with the old policy on its device) end one update with the
    one-device parameters."""
    torch.manual_seed(0)
    batch = _sample(CONFIG, 8 * FRAGMENT)
    reference = _policy(CONFIG)
    towered = _policy(CONFIG)
    towered.set_weights(reference.get_weights())
    _perturb_old_policy(reference)
    _perturb_old_policy(towered)
    ref_info = reference.learn_on_batch(batch)
    towers = TowerSet(towered, [torch.device("cpu")] * num_towers, num_stacks=1)
    towers.load(batch, 0)
    info = towers.learn_on_loaded(0)
    for a, b in zip(reference.model.parameters(), towered.model.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    for key in ("policy_loss", "vf_loss", "kl"):
        assert info["learner_stats"][key] == pytest.approx(ref_info["learner_stats"][key],
                                                           rel=1e-4, abs=1e-6)


# ---- training ----------------------------------------------------------------------------
async def test_appo_trains_through_the_impala_pipeline_with_two_passes(tmp_path):
    """A few iterations of the real pipeline and learner process: every train batch is
    served num_sgd_iter times (trained rows = 2 x sampled rows, within what is in flight)
    and the old policy is synced every num_sgd_iter x minibatch_buffer_size updates."""
    spec = get_algorithm("appo")
    config = load_config(spec.config_cls, {
        "num_workers": 1, "seed": 0, "min_iter_time_s": 0, "timesteps_per_iteration": 2000,
        "num_sgd_iter": 2, "minibatch_buffer_size": 2})
    async with Driver.start(str(tmp_path / "s")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        try:
            for _ in range(3):
                result = await trainer.train()
        finally:
            await trainer.stop()
    stats = result["info"]["learner"]
    stats = stats.get("default_policy", stats)
    assert stats["num_target_updates"] >= 1
    trained, sampled = result["info"]["num_steps_trained"], result["info"]["num_steps_sampled"]
    assert trained > 1.5 * (sampled - 4 * config.train_batch_size), (trained, sampled)


RLLIB_CARTPOLE_APPO = """\
cartpole-appo:
    env: CartPole-v1
    run: APPO
    stop:
        episode_reward_mean: 180
        timesteps_total: 200000
    config:
        num_envs_per_worker: 5
        num_workers: 1
        num_gpus: 0
        observation_filter: MeanStdFilter
        num_sgd_iter: 6
        vf_loss_coeff: 0.01
        vtrace: true
        model:
            fcnet_hiddens: [32]
            fcnet_activation: linear
            vf_share_layers: true
"""


def _train_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "actorrl.cli.main", "train", *args,
         "--output", str(tmp_path / "results"), "--progress", "plain"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    return proc, json.loads((run_dir / "run.json").read_text())


def test_rllib_cartpole_appo_file_runs(tmp_path):
    """RLlib's cartpole-appo tuned example (its layout and keys; 1 worker instead of 4)
    loads and trains for two 1,000-step iterations through the CLI."""
    path = tmp_path / "cartpole-appo.yaml"
    path.write_text(RLLIB_CARTPOLE_APPO)
    _, status = _train_cli(tmp_path, "--config", str(path), "--stop-timesteps", "2000",
                           "--stop-reward", "none", "--set", "min_iter_time_s=0",
                           "--set", "timesteps_per_iteration=1000")
    assert status["training_iteration"] == 2 and status["timesteps_total"] >= 2000


@pytest.mark.learning
def test_appo_defaults_solve_cartpole(tmp_path):
    """``actorrl train appo --env CartPole-v1`` with its defaults reaches a mean return of
    450 within 1.5M env steps (it takes ~0.6M here)."""
    proc, status = _train_cli(tmp_path, "appo", "--env", "CartPole-v1", "--stop-reward",
                              "450", "--stop-timesteps", "1500000", "--seed", "0")
    assert status["best_reward"] >= 450, (status, proc.stdout[-2000:])


def test_the_old_policys_outputs_are_computed_once_per_batch_and_sync():
    """Served num_sgd_iter times under one old policy, a batch costs one old-policy forward
    pass; after a sync the next pass recomputes. The losses equal a cache-free policy's."""
    config = {**CONFIG, "num_sgd_iter": 2, "minibatch_buffer_size": 2}
    spec = get_algorithm("appo")
    policy_config = load_config(spec.config_cls, config).component("policy")
    policy, fresh = APPOPolicy(*_spaces(), policy_config), APPOPolicy(*_spaces(), policy_config)
    fresh.set_weights(policy.get_weights())
    calls = []
    target = policy.target_model(policy.model)
    target.policy_head.register_forward_pre_hook(lambda *_: calls.append(1))
    batches = [_sample(CONFIG, 2 * FRAGMENT, seed=s) for s in (1, 2)]
    order = [0, 1, 0, 1, 0, 1]  # the minibatch buffer's: 2 batches x 2 passes, then a sync
    for update, index in enumerate(order, start=1):
        stats = policy.learn_on_batch(batches[index])["learner_stats"]
        fresh._old_outputs.clear()  # the reference never reuses anything
        assert stats["policy_loss"] == pytest.approx(
            fresh.learn_on_batch(batches[index])["learner_stats"]["policy_loss"], rel=1e-5)
        if update == 4:
            assert len(calls) == 2  # one forward pass per batch for 4 updates
    assert policy.num_target_updates == 1 and len(calls) == 4  # recomputed after the sync
