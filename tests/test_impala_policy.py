"""ImpalaPolicy: actions and extras, the V-trace loss on multi-env batches, learning."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.data.batch import SampleBatch
from actorrl.policy.impala import (
    ImpalaPolicy,
    ImpalaPolicyConfig,
    from_time_major,
    to_time_major,
)
from tests.helpers.configs import IMPALA_CARTPOLE
from tests.helpers.returns import assert_window_reached, window_reached

torch.set_num_threads(1)

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
SMALL_MODEL = {"model": {"fcnet_hiddens": [16], "fcnet_activation": "tanh"}}


def env_fragment(rng: np.random.Generator, length: int, episode_ends: dict[int, str],
                 first_eps_id: int) -> dict[str, np.ndarray]:
    """``length`` consecutive steps of one env. ``episode_ends`` maps a step to
    'terminated' or 'truncated'; the next step starts a new episode (new eps_id, t = 0).
    Within an episode new_obs[t] == obs[t + 1]. Behaviour logits are random."""
    cols: dict[str, list] = {k: [] for k in (
        "obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id", "t",
        "action_dist_inputs", "action_logp")}
    obs = rng.normal(size=4).astype(np.float32)
    eps_id, t = first_eps_id, 0
    for step in range(length):
        logits = rng.normal(size=3).astype(np.float32)
        probs = np.exp(logits) / np.exp(logits).sum()
        action = int(rng.choice(3, p=probs))
        new_obs = rng.normal(size=4).astype(np.float32)
        ending = episode_ends.get(step)
        for key, value in (("obs", obs), ("new_obs", new_obs), ("actions", action),
                           ("rewards", rng.normal()), ("terminateds", ending == "terminated"),
                           ("truncateds", ending == "truncated"), ("eps_id", eps_id),
                           ("t", t), ("action_dist_inputs", logits),
                           ("action_logp", np.log(probs[action]))):
            cols[key].append(value)
        if ending:
            obs, eps_id, t = rng.normal(size=4).astype(np.float32), eps_id + 1, 0
        else:
            obs, t = new_obs, t + 1
    return {k: np.array(v) for k, v in cols.items()}


def multi_env_batch(seed: int, lengths: list[int]) -> SampleBatch:
    """Fragments of several envs concatenated env by env, with terminations and
    truncations at random steps."""
    rng = np.random.default_rng(seed)
    pieces = []
    for e, length in enumerate(lengths):
        ends = {int(s): str(rng.choice(["terminated", "truncated"]))
                for s in rng.choice(length, size=min(2, length), replace=False)}
        pieces.append(env_fragment(rng, length, ends, first_eps_id=1000 * (e + 1)))
    return SampleBatch({k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]})


def reference_loss_terms(policy: ImpalaPolicy, batch: SampleBatch, horizon: int
                         ) -> tuple[float, float]:
    """(policy_loss, vf_loss) by the explicit V-trace sum, one row at a time.

    Row s's trace runs to the first row ``end >= s`` that ends its trajectory
    (terminated, truncated, next row of another episode, last row) or its sequence (row
    index T-1 mod T). Inside the trace V(x_{t+1}) is the value of the next row's obs; after
    ``end`` it is V(new_obs[end]), or 0 when ``end`` terminated.
    """
    cfg = policy.impala_config
    gamma = cfg.gamma
    with torch.no_grad():
        logits, values = policy.model(torch.as_tensor(batch["obs"]))
        _, boot = policy.model(torch.as_tensor(batch["new_obs"]))
        logp = torch.log_softmax(logits, 1).gather(
            1, torch.as_tensor(batch["actions"]).view(-1, 1)).squeeze(1)
    values, boot, logp = values.double().numpy(), boot.double().numpy(), logp.double().numpy()
    rhos = np.exp(logp - batch["action_logp"])
    rewards, term = batch["rewards"], batch["terminateds"]
    count = batch.count
    ends = [bool(term[i] or batch["truncateds"][i] or i == count - 1
                 or batch["eps_id"][i + 1] != batch["eps_id"][i] or i % horizon == horizon - 1)
            for i in range(count)]

    def v_after(t: int, end: int) -> float:
        if t < end:
            return values[t + 1]
        return 0.0 if term[t] else boot[t]

    vs = np.zeros(count)
    end_of = np.zeros(count, dtype=int)
    for s in range(count):
        end = s
        while not ends[end]:
            end += 1
        end_of[s] = end
        total = 0.0
        for t in range(s, end + 1):
            coef = 1.0
            for i in range(s, t):
                coef *= gamma * min(1.0, rhos[i])
            delta = rewards[t] + gamma * v_after(t, end) - values[t]
            total += coef * min(cfg.vtrace_clip_rho_threshold, rhos[t]) * delta
        vs[s] = values[s] + total
    adv = np.zeros(count)
    for s in range(count):
        next_target = vs[s + 1] if s < end_of[s] else v_after(s, end_of[s])
        adv[s] = min(cfg.vtrace_clip_pg_rho_threshold, rhos[s]) * (
            rewards[s] + gamma * next_target - values[s])
    return float(-np.mean(logp * adv)), float(0.5 * np.mean((values - vs) ** 2))


@pytest.mark.parametrize(
    ("lengths", "horizon"),
    [([5, 5, 5], 5), ([7, 3, 9], 5), ([13], 4), ([6, 6], 4), ([2, 1, 8], 3)],
)
def test_loss_matches_per_row_reference(lengths: list[int], horizon: int) -> None:
    """On batches of several envs' fragments, with terminations, truncations, env changes
    inside a sequence and a count not divisible by T, the policy and value losses equal
    the explicit per-row V-trace sums."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {
        **SMALL_MODEL, "rollout_fragment_length": horizon, "gamma": 0.9,
        "vtrace_clip_rho_threshold": 1.2, "vtrace_clip_pg_rho_threshold": 0.8})
    batch = multi_env_batch(sum(lengths) + horizon, lengths)
    out = policy.loss(policy.model, policy.batch_to_tensors(batch))
    pi_loss, vf_loss = reference_loss_terms(policy, batch, horizon)
    assert float(out.stats["policy_loss"]) == pytest.approx(pi_loss, rel=1e-4, abs=1e-6)
    assert float(out.stats["vf_loss"]) == pytest.approx(vf_loss, rel=1e-4, abs=1e-6)


def test_one_env_without_ids_cuts_at_terminated_and_truncated() -> None:
    """Without eps_id and t, the terminated and truncated flags alone end trajectories
    inside a sequence; one env's batch still matches the reference."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {**SMALL_MODEL, "rollout_fragment_length": 6})
    rng = np.random.default_rng(4)
    batch = SampleBatch(env_fragment(rng, 14, {2: "truncated", 4: "terminated",
                                               9: "truncated"}, first_eps_id=1))
    pi_loss, vf_loss = reference_loss_terms(policy, batch, 6)
    del batch["eps_id"], batch["t"]
    stats = policy.loss(policy.model, policy.batch_to_tensors(batch)).stats
    assert float(stats["policy_loss"]) == pytest.approx(pi_loss, rel=1e-4, abs=1e-6)
    assert float(stats["vf_loss"]) == pytest.approx(vf_loss, rel=1e-4, abs=1e-6)


def test_fragment_per_env_layout_needs_no_episode_ids() -> None:
    """With fragments of exactly T rows per env (the rollout worker's truncate_episodes
    layout), sequences align with envs, so dropping eps_id and t changes nothing."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {**SMALL_MODEL, "rollout_fragment_length": 6})
    batch = multi_env_batch(3, [6, 6, 6])
    with_ids = policy.loss(policy.model, policy.batch_to_tensors(batch))
    del batch["eps_id"], batch["t"]
    without = policy.loss(policy.model, policy.batch_to_tensors(batch))
    for key in ("policy_loss", "vf_loss", "total_loss"):
        assert float(with_ids.stats[key]) == pytest.approx(float(without.stats[key]), rel=1e-6)


def test_env_fragments_are_independent() -> None:
    """The loss on two envs' T-row fragments is the mean of the losses on each alone: no
    value leaks from one env's trajectory into the other's targets."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {**SMALL_MODEL, "rollout_fragment_length": 8})
    both = multi_env_batch(5, [8, 8])
    first, second = both.slice(0, 8), both.slice(8, 16)

    def total(batch: SampleBatch) -> float:
        return float(policy.loss(policy.model, policy.batch_to_tensors(batch)).loss.detach())

    assert total(both) == pytest.approx((total(first) + total(second)) / 2, rel=1e-5)


def test_time_major_round_trip_pads_the_last_sequence() -> None:
    """[N] -> [T, B] puts row b*T + t at [t, b], zero-pads, and inverts exactly."""
    x = torch.arange(1.0, 8.0)
    tm = to_time_major(x, 3)
    assert tm.shape == (3, 3)
    assert tm[:, 0].tolist() == [1.0, 2.0, 3.0] and tm[:, 2].tolist() == [7.0, 0.0, 0.0]
    torch.testing.assert_close(from_time_major(tm, 7), x)


def test_compute_actions_returns_behaviour_outputs() -> None:
    """Extras hold the behaviour logits and the log-probability of the chosen action;
    explore=False takes the argmax."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, SMALL_MODEL)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    logits = extras[SampleBatch.ACTION_DIST_INPUTS]
    assert actions.shape == (64,) and logits.shape == (64, 3)
    log_probs = torch.log_softmax(torch.as_tensor(logits), 1).numpy()
    np.testing.assert_allclose(extras[SampleBatch.ACTION_LOGP],
                               log_probs[np.arange(64), actions], rtol=1e-5)
    greedy, _ = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(greedy, logits.argmax(1))


def test_on_policy_importance_weights_are_one() -> None:
    """Data from the current policy has rho = 1 (mean_IS 1, var_IS 0)."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {**SMALL_MODEL, "rollout_fragment_length": 5})
    batch = multi_env_batch(1, [10])
    _, extras = policy.compute_actions(batch["obs"])
    with torch.no_grad():
        logits, _ = policy.model(torch.as_tensor(batch["obs"]))
    batch["action_logp"] = torch.log_softmax(logits, 1).gather(
        1, torch.as_tensor(batch["actions"]).view(-1, 1)).squeeze(1).numpy()
    stats = policy.loss(policy.model, policy.batch_to_tensors(batch)).stats
    assert float(stats["mean_IS"]) == pytest.approx(1.0, abs=1e-5)
    assert float(stats["var_IS"]) == pytest.approx(0.0, abs=1e-8)
    assert {"policy_loss", "vf_loss", "entropy", "var_gnorm", "vf_explained_var",
            "cur_lr"} <= set(stats)


def _read_only(obj):
    if isinstance(obj, np.ndarray):
        frozen = obj.copy()
        frozen.flags.writeable = False
        return frozen
    if isinstance(obj, dict):
        return {k: _read_only(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_read_only(v) for v in obj]
    return obj


def test_a_state_restored_from_read_only_arrays_keeps_training() -> None:
    """A checkpoint's state reaches the learner as read-only shared memory; Adam updates
    its moments in place, so restoring must not alias those arrays (it was a SIGSEGV in
    the learner on ``actorrl train --restore``)."""
    torch.manual_seed(0)
    config = {**SMALL_MODEL, "rollout_fragment_length": 10}
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, config)
    batch = multi_env_batch(2, [10, 10])
    policy.learn_on_batch(batch)
    state = _read_only(policy.get_state())
    restored = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, config)
    restored.set_state(state)
    given = {a.ctypes.data for a in state["optimizer"]["state"][0].values()
             if isinstance(a, np.ndarray)}
    moments = [t for s in restored.optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0]
    assert moments and not {t.data_ptr() for t in moments} & given
    restored.learn_on_batch(batch)  # writes the moments in place


@pytest.mark.parametrize(("opt_type", "lr"), [("adam", 3e-3), ("rmsprop", 1e-2)])
def test_loss_decreases_on_a_fixed_batch(opt_type: str, lr: float) -> None:
    """Repeated learn_on_batch on one batch lowers the total and the value loss (by 30%
    within 100 steps); both optimizers run."""
    torch.manual_seed(0)
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {
        **SMALL_MODEL, "rollout_fragment_length": 10, "lr": lr, "opt_type": opt_type})
    batch = multi_env_batch(2, [10, 10, 10, 7])
    first = policy.learn_on_batch(batch)["learner_stats"]
    for _ in range(100):
        last = policy.learn_on_batch(batch)["learner_stats"]
    assert last["vf_loss"] < 0.7 * first["vf_loss"]
    assert last["total_loss"] < 0.7 * first["total_loss"]


def test_rmsprop_settings() -> None:
    """opt_type rmsprop uses decay, momentum and epsilon as RLlib does."""
    policy = ImpalaPolicy(OBS_SPACE, ACTION_SPACE, {**SMALL_MODEL, "opt_type": "rmsprop"})
    assert isinstance(policy.optimizer, torch.optim.RMSprop)
    group = policy.optimizer.param_groups[0]
    assert (group["alpha"], group["momentum"], group["eps"]) == (0.99, 0.0, 0.1)
    assert isinstance(ImpalaPolicy(OBS_SPACE, ACTION_SPACE, SMALL_MODEL).optimizer,
                      torch.optim.Adam)


def test_invalid_config_names_the_key() -> None:
    """Bad values are reported by key."""
    with pytest.raises(ValueError, match="opt_type must be 'adam' or 'rmsprop'"):
        ImpalaPolicyConfig.load({"opt_type": "sgd"})
    with pytest.raises(ValueError, match="rollout_fragment_length must be >= 1"):
        ImpalaPolicyConfig.load({"rollout_fragment_length": 0})


def test_continuous_actions() -> None:
    """A 1-D Box action space gets a diagonal Gaussian; the loss runs."""
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = ImpalaPolicy(OBS_SPACE, space, {**SMALL_MODEL, "rollout_fragment_length": 4})
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    actions, extras = policy.compute_actions(obs)
    assert actions.shape == (8, 2) and extras["action_dist_inputs"].shape == (8, 4)
    batch = SampleBatch(obs=obs, new_obs=obs, actions=actions, rewards=np.ones(8, np.float32),
                        terminateds=np.zeros(8, bool), truncateds=np.zeros(8, bool), **extras)
    info = policy.learn_on_batch(batch)
    assert np.isfinite(info["learner_stats"]["total_loss"])


def run_impala_cartpole(config: dict, seed: int, max_env_steps: int, target: float,
                        actor_lag: int = 2, window: int = 20) -> tuple[int, list[float]]:
    """Single-process IMPALA: an actor copy of the policy, refreshed every ``actor_lag``
    updates (so the data is off-policy), steps ``num_envs_per_worker`` CartPoles; each
    env's ``rollout_fragment_length`` steps form one fragment, fragments are concatenated
    env by env until ``train_batch_size`` rows, then one learn_on_batch. Stops when the
    mean return of the last ``window`` episodes reaches ``target``."""
    torch.manual_seed(seed)
    num_envs, horizon = config["num_envs_per_worker"], config["rollout_fragment_length"]
    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    obs = np.stack([env.reset(seed=seed * 100 + i)[0] for i, env in enumerate(envs)])
    learner = ImpalaPolicy(envs[0].observation_space, envs[0].action_space, dict(config))
    actor = ImpalaPolicy(envs[0].observation_space, envs[0].action_space, dict(config))
    actor.set_weights(learner.get_weights())
    eps_ids = np.arange(num_envs)
    episode_return = np.zeros(num_envs)
    returns: list[float] = []
    pending: list[SampleBatch] = []
    env_steps = updates = 0
    while env_steps < max_env_steps:
        steps: list[dict[str, np.ndarray]] = []
        for _ in range(horizon):
            actions, extras = actor.compute_actions(obs)
            row = {"obs": obs.copy(), "actions": actions, "eps_id": eps_ids.copy(), **extras}
            results = [env.step(int(a)) for env, a in zip(envs, actions)]
            row["new_obs"] = np.stack([r[0] for r in results])
            row["rewards"] = np.array([r[1] for r in results], np.float32)
            row["terminateds"] = np.array([r[2] for r in results])
            row["truncateds"] = np.array([r[3] for r in results])
            steps.append(row)
            obs = row["new_obs"].copy()
            episode_return += row["rewards"]
            for i in np.flatnonzero(row["terminateds"] | row["truncateds"]):
                returns.append(float(episode_return[i]))
                episode_return[i] = 0.0
                obs[i] = envs[i].reset()[0]
                eps_ids[i] = eps_ids.max() + 1
        env_steps += horizon * num_envs
        for i in range(num_envs):  # one fragment per env, env by env
            pending.append(SampleBatch({k: np.stack([s[k][i] for s in steps]) for k in steps[0]}))
        if sum(b.count for b in pending) >= config["train_batch_size"]:
            learner.learn_on_batch(SampleBatch.concat_samples(pending))
            pending, updates = [], updates + 1
            if updates % actor_lag == 0:
                actor.set_weights(learner.get_weights())
        if window_reached(returns, window, target):
            break
    return env_steps, returns


@pytest.mark.learning
def test_impala_learns_cartpole() -> None:
    """With IMPALA_CARTPOLE and a lagged actor, the mean return of the last 20
    CartPole-v1 episodes reaches 150 within 60k env steps (12-19k for seeds 0-6)."""
    env_steps, returns = run_impala_cartpole(IMPALA_CARTPOLE, seed=0,
                                             max_env_steps=60_000, target=150.0)
    assert_window_reached(returns, env_steps, 20, 150.0)
