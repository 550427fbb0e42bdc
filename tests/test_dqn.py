"""DQNPolicy: n-step returns, targets, loss, target sync, exploration, priorities."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.data.batch import SampleBatch
from actorrl.policy.dqn import (
    N_STEPS,
    DQNPolicy,
    DQNPolicyConfig,
    adjust_nstep,
    apex_worker_epsilon,
    huber_loss,
)
from actorrl.replay import PrioritizedSampler, ReplayBuffer
from tests.helpers.configs import DQN_CARTPOLE
from tests.helpers.returns import assert_window_reached, window_reached

torch.set_num_threads(1)

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def slow_nstep(batch: SampleBatch, n_step: int, gamma: float) -> dict[str, np.ndarray]:
    """Reference n-step: for each row walk forward one step at a time, stopping after
    ``n_step`` rewards, at a terminated or truncated row, at an episode change, or at the
    end of the fragment."""
    rows = batch.count
    out: dict[str, list] = {"rewards": [], "new_obs": [], "terminateds": [], "n_steps": []}
    for i in range(rows):
        total, j = 0.0, i
        while True:
            total += gamma ** (j - i) * float(batch["rewards"][j])
            stop = (j - i + 1 == n_step or bool(batch["terminateds"][j])
                    or bool(batch["truncateds"][j]) or j == rows - 1
                    or batch["eps_id"][j + 1] != batch["eps_id"][j])
            if stop:
                break
            j += 1
        out["rewards"].append(total)
        out["new_obs"].append(batch["new_obs"][j])
        out["terminateds"].append(bool(batch["terminateds"][j]))
        out["n_steps"].append(j - i + 1)
    return {k: np.array(v) for k, v in out.items()}


def fragment(rng: np.random.Generator, lengths: list[int], ending: str) -> SampleBatch:
    """Consecutive episodes of the given lengths; every episode but the last terminates,
    the last ends with ``ending``: 'terminated', 'truncated' or 'cut' (fragment ends
    mid-episode)."""
    cols: dict[str, list] = {k: [] for k in
                             ("obs", "new_obs", "actions", "rewards", "terminateds",
                              "truncateds", "eps_id")}
    for e, length in enumerate(lengths):
        last_ending = "terminated" if e < len(lengths) - 1 else ending
        obs = rng.normal(size=(length + 1, 3)).astype(np.float32)
        cols["obs"].extend(obs[:-1])
        cols["new_obs"].extend(obs[1:])
        cols["actions"].extend(rng.integers(0, 2, length))
        cols["rewards"].extend(rng.normal(size=length).astype(np.float32))
        term = np.zeros(length, bool)
        trunc = np.zeros(length, bool)
        if last_ending == "terminated":
            term[-1] = True
        elif last_ending == "truncated":
            trunc[-1] = True
        cols["terminateds"].extend(term)
        cols["truncateds"].extend(trunc)
        cols["eps_id"].extend([100 + e] * length)
    return SampleBatch({k: np.array(v) for k, v in cols.items()})


@pytest.mark.parametrize("n_step", [1, 2, 3, 5])
@pytest.mark.parametrize("ending", ["terminated", "truncated", "cut"])
@pytest.mark.parametrize("lengths", [[7], [1], [3], [2, 6], [4, 1, 5]])
def test_nstep_matches_slow_reference(n_step: int, ending: str, lengths: list[int]) -> None:
    """Vectorized n-step equals the step-by-step reference: termination inside the window
    stops the sum and sets the done flag, truncation and a fragment cut bootstrap from the
    last available new_obs with the actual number of steps."""
    rng = np.random.default_rng(n_step * 100 + len(lengths))
    batch = fragment(rng, lengths, ending)
    gamma = 0.9
    got = adjust_nstep(batch, n_step, gamma)
    want = slow_nstep(batch, n_step, gamma)
    np.testing.assert_allclose(got["rewards"], want["rewards"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["new_obs"], want["new_obs"])
    np.testing.assert_array_equal(got["terminateds"], want["terminateds"])
    np.testing.assert_array_equal(got[N_STEPS], want["n_steps"])
    np.testing.assert_array_equal(got["obs"], batch["obs"])
    np.testing.assert_array_equal(got["actions"], batch["actions"])


def test_nstep_hand_computed_example() -> None:
    """A 4-step episode terminating at the last step, n = 3, gamma = 0.5."""
    batch = SampleBatch(
        obs=np.arange(4.0).reshape(4, 1), new_obs=np.arange(1.0, 5.0).reshape(4, 1),
        actions=np.zeros(4, np.int64), rewards=np.array([1.0, 2.0, 4.0, 8.0]),
        terminateds=np.array([False, False, False, True]), truncateds=np.zeros(4, bool),
        eps_id=np.zeros(4, np.int64),
    )
    out = adjust_nstep(batch, 3, 0.5)
    np.testing.assert_allclose(out["rewards"], [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8])
    np.testing.assert_array_equal(out["new_obs"][:, 0], [3.0, 4.0, 4.0, 4.0])
    np.testing.assert_array_equal(out["terminateds"], [False, True, True, True])
    np.testing.assert_array_equal(out[N_STEPS], [3, 3, 2, 1])


def table_policy(q_online: np.ndarray, q_target: np.ndarray, **config: object) -> DQNPolicy:
    """A DQN policy over Discrete(S) observations whose Q-networks are exact lookup tables
    (one-hot input, no hidden layers, no dueling)."""
    num_states, num_actions = q_online.shape
    cfg = {"model": {"fcnet_hiddens": []}, "hiddens": [], "dueling": False, **config}
    policy = DQNPolicy(gym.spaces.Discrete(num_states), gym.spaces.Discrete(num_actions), cfg)
    for model, table in ((policy.model, q_online), (policy.target_model, q_target)):
        layer = model.advantage[0]
        with torch.no_grad():
            layer.weight.copy_(torch.as_tensor(table.T, dtype=torch.float32))
            layer.bias.zero_()
    return policy


Q_ONLINE = np.array([[1.0, 2.0, 0.0], [0.0, 5.0, 1.0], [3.0, 0.0, 2.0]])
Q_TARGET = np.array([[0.5, 0.0, 4.0], [7.0, 1.0, 2.0], [1.0, 9.0, 0.0]])


def transitions() -> SampleBatch:
    """Three transitions of the table MDP, one terminated, with 1- and 2-step rows."""
    return SampleBatch(
        obs=np.array([0, 1, 2]), actions=np.array([1, 2, 0]), new_obs=np.array([1, 2, 0]),
        rewards=np.array([1.0, -1.0, 0.5], np.float32),
        terminateds=np.array([False, False, True]), truncateds=np.zeros(3, bool),
        n_steps=np.array([1, 2, 1], np.int32),
    )


@pytest.mark.parametrize("double_q", [True, False])
def test_double_q_target(double_q: bool) -> None:
    """Double Q evaluates the online argmax with the target net; plain DQN takes the target
    max. The discount is gamma ** n_steps and terminated rows do not bootstrap."""
    gamma = 0.9
    policy = table_policy(Q_ONLINE, Q_TARGET, gamma=gamma, double_q=double_q)
    batch = transitions()
    td = policy.compute_td_error(batch)
    expected = []
    for s, a, s2, r, done, k in zip(batch["obs"], batch["actions"], batch["new_obs"],
                                    batch["rewards"], batch["terminateds"], batch["n_steps"]):
        if double_q:
            bootstrap = Q_TARGET[s2, np.argmax(Q_ONLINE[s2])]
        else:
            bootstrap = Q_TARGET[s2].max()
        expected.append(Q_ONLINE[s, a] - (r + gamma**k * (1 - done) * bootstrap))
    np.testing.assert_allclose(td, expected, rtol=1e-6)
    # the two rules differ on this data, so the test tells them apart
    assert Q_TARGET[2, np.argmax(Q_ONLINE[2])] != Q_TARGET[2].max()


def test_without_n_steps_column_discount_is_gamma_pow_n() -> None:
    """Batches without the ``n_steps`` column use gamma ** n_step for every row."""
    policy = table_policy(Q_ONLINE, Q_TARGET, gamma=0.9, n_step=3, double_q=False)
    batch = transitions()
    del batch["n_steps"]
    td = policy.compute_td_error(batch)
    assert td[0] == pytest.approx(Q_ONLINE[0, 1] - (1.0 + 0.9**3 * Q_TARGET[1].max()))


def test_dueling_aggregation_and_shape() -> None:
    """Dueling Q = V + A - mean(A): shape [B, actions], and Q averaged over actions is V."""
    torch.manual_seed(0)
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(5),
                       {"dueling": True, "hiddens": [16], "model": {"fcnet_hiddens": [8]}})
    obs = torch.randn(6, 4)
    q = policy.model(obs)
    assert q.shape == (6, 5)
    features = policy.model.trunk(obs)
    value = policy.model.value(features)
    advantage = policy.model.advantage(features)
    assert value.shape == (6, 1) and advantage.shape == (6, 5)
    torch.testing.assert_close(q, value + advantage - advantage.mean(1, keepdim=True))
    torch.testing.assert_close(q.mean(1, keepdim=True), value)
    plain = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(5), {"dueling": False})
    assert plain.model.value is None and plain.model(obs).shape == (6, 5)


def test_huber_loss_values() -> None:
    """Quadratic inside the threshold, linear outside, continuous at the threshold."""
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    expected = torch.tensor([2.5, 0.5, 0.125, 0.0, 0.125, 0.5, 2.5])
    torch.testing.assert_close(huber_loss(x, 1.0), expected)
    torch.testing.assert_close(huber_loss(torch.tensor([4.0]), 2.0), torch.tensor([6.0]))


def test_loss_is_weighted_mean_of_huber() -> None:
    """loss = mean(weights * huber(td)); a zero weight removes a row's gradient."""
    policy = table_policy(Q_ONLINE, Q_TARGET, gamma=0.9, huber_threshold=1.0)
    batch = transitions()
    td = policy.compute_td_error(batch)
    weights = np.array([2.0, 0.0, 0.5], np.float32)
    batch["weights"] = weights
    out = policy.loss(policy.model, policy.batch_to_tensors(batch))
    hub = np.where(np.abs(td) < 1.0, 0.5 * td**2, np.abs(td) - 0.5)
    assert float(out.loss.detach()) == pytest.approx(float(np.mean(weights * hub)), rel=1e-6)
    np.testing.assert_allclose(out.per_sample["td_error"].numpy(), td, rtol=1e-6)

    out.loss.backward()
    grad = policy.model.advantage[0].weight.grad  # [actions, states]
    # row 1 (state 1, action 2) has weight 0: its table entry gets no gradient
    assert float(grad[2, 1]) == 0.0
    assert float(grad[1, 0]) != 0.0 and float(grad[0, 2]) != 0.0


def test_learn_on_batch_returns_td_error_per_row() -> None:
    """learn_on_batch returns a numpy td_error with one entry per row, computed before the
    step, and the step lowers the loss on that batch."""
    torch.manual_seed(1)
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2),
                       {"lr": 1e-2, "model": {"fcnet_hiddens": [32]}, "hiddens": [32]})
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        obs=rng.normal(size=(40, 4)).astype(np.float32),
        new_obs=rng.normal(size=(40, 4)).astype(np.float32),
        actions=rng.integers(0, 2, 40), rewards=rng.normal(size=40).astype(np.float32),
        terminateds=rng.random(40) < 0.1, truncateds=np.zeros(40, bool),
        weights=np.ones(40, np.float32),
    )
    before = policy.compute_td_error(batch)
    info = policy.learn_on_batch(batch)
    assert isinstance(info["td_error"], np.ndarray) and info["td_error"].shape == (40,)
    np.testing.assert_allclose(info["td_error"], before, rtol=1e-5, atol=1e-6)
    assert {"mean_q", "min_q", "max_q", "mean_td_error", "loss"} <= set(info["learner_stats"])
    after = policy.compute_td_error(batch)
    assert np.mean(np.abs(after)) < np.mean(np.abs(before))


def _random_batch(rows: int, seed: int = 0) -> SampleBatch:
    rng = np.random.default_rng(seed)
    return SampleBatch(
        obs=rng.normal(size=(rows, 4)).astype(np.float32),
        new_obs=rng.normal(size=(rows, 4)).astype(np.float32),
        actions=rng.integers(0, 2, rows), rewards=rng.normal(size=rows).astype(np.float32),
        terminateds=np.zeros(rows, bool), truncateds=np.zeros(rows, bool),
    )


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


def test_target_sync_every_freq_trained_rows() -> None:
    """The target net is synced when trained rows since the last sync reach
    target_network_update_freq: with 32-row batches and freq 100, after updates 4, 8, 12."""
    torch.manual_seed(0)
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2),
                       {"target_network_update_freq": 100, "lr": 1e-3,
                        "model": {"fcnet_hiddens": [16]}, "hiddens": [16]})
    batch = _random_batch(32)
    synced_at = []
    for update in range(1, 13):
        policy.learn_on_batch(batch)
        in_sync = _same_weights(policy.model, policy.target_model)
        if in_sync:
            synced_at.append(update)
    assert synced_at == [4, 8, 12]
    assert policy.num_target_updates == 3
    assert policy.num_steps_trained == 12 * 32


def test_target_sync_counts_rows_of_gradients_applied() -> None:
    """Gradients computed on this policy count their batch rows; gradients from elsewhere
    count train_batch_size rows per update."""
    torch.manual_seed(0)
    config = {"target_network_update_freq": 50, "train_batch_size": 10,
              "model": {"fcnet_hiddens": [8]}, "hiddens": [8]}
    learner = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), config)
    grads, info = learner.compute_gradients(_random_batch(30))
    assert info["batch_count"] == 30
    learner.apply_gradients(grads)
    assert learner.num_steps_trained == 30 and learner.num_target_updates == 0
    remote = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), config)
    for _ in range(2):
        learner.apply_gradients(remote.compute_gradients(_random_batch(30))[0])
    assert learner.num_steps_trained == 50
    assert learner.num_target_updates == 1
    assert _same_weights(learner.model, learner.target_model)


def test_epsilon_linear_schedule() -> None:
    """Epsilon falls linearly from initial to final over epsilon_timesteps, then stays."""
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {
        "exploration_config": {"initial_epsilon": 1.0, "final_epsilon": 0.02,
                               "epsilon_timesteps": 10000}})
    for t, eps in [(0, 1.0), (2500, 0.755), (5000, 0.51), (10000, 0.02), (50000, 0.02)]:
        policy.on_global_timestep(t)
        assert policy.current_epsilon() == pytest.approx(eps, abs=1e-12)
    defaults = DQNPolicyConfig.load({}).exploration_config
    assert (defaults.initial_epsilon, defaults.final_epsilon,
            defaults.epsilon_timesteps) == (1.0, 0.02, 10000)


def test_compute_actions_explores_at_epsilon_and_advances_timestep() -> None:
    """With epsilon e and 2 actions, a fraction e/2 of actions differ from the greedy one;
    exploring advances global_timestep by the batch size; explore=False is greedy."""
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {
        "seed": 3, "model": {"fcnet_hiddens": [8]}, "hiddens": [8],
        "exploration_config": {"initial_epsilon": 0.5, "final_epsilon": 0.5}})
    obs = np.random.default_rng(0).normal(size=(20000, 4)).astype(np.float32)
    greedy, _ = policy.compute_actions(obs, explore=False)
    assert policy.global_timestep == 0
    actions, extras = policy.compute_actions(obs, explore=True)
    assert policy.global_timestep == 20000 and extras == {}
    assert np.mean(actions != greedy) == pytest.approx(0.25, abs=0.015)


def test_apex_per_worker_epsilons() -> None:
    """Worker i of N explores with 0.4 ** (1 + 7 (i-1)/(N-1)) whatever the timestep; a
    single worker uses 0.4; the learner (worker 0) is greedy."""
    num_workers = 4
    for i in range(1, num_workers + 1):
        policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {
            "per_worker_exploration": True, "worker_index": i, "num_workers": num_workers})
        policy.on_global_timestep(123456)
        expected = 0.4 ** (1 + 7 * (i - 1) / (num_workers - 1))
        assert policy.current_epsilon() == pytest.approx(expected, rel=1e-12)
    assert apex_worker_epsilon(1, 4) == pytest.approx(0.4)
    assert apex_worker_epsilon(4, 4) == pytest.approx(0.4**8)
    assert apex_worker_epsilon(1, 1) == pytest.approx(0.4)
    learner = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {
        "per_worker_exploration": True, "worker_index": 0, "num_workers": 4})
    assert learner.current_epsilon() == 0.0
    obs = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32)
    np.testing.assert_array_equal(learner.compute_actions(obs)[0],
                                  learner.compute_actions(obs, explore=False)[0])


def test_postprocess_weights_and_worker_side_priorities() -> None:
    """Postprocessing adds n_steps and unit weights; with worker_side_prioritization the
    weights are |td_error| + prioritized_replay_eps of the n-step rows."""
    torch.manual_seed(0)
    batch = fragment(np.random.default_rng(0), [6], "cut")
    batch["obs"] = np.concatenate([batch["obs"], np.zeros((6, 1), np.float32)], axis=1)
    batch["new_obs"] = np.concatenate([batch["new_obs"], np.zeros((6, 1), np.float32)], axis=1)
    plain = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {"n_step": 3})
    out = plain.postprocess_trajectory(batch)
    np.testing.assert_array_equal(out["weights"], np.ones(6))
    np.testing.assert_array_equal(out[N_STEPS], [3, 3, 3, 3, 2, 1])

    worker = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {
        "n_step": 3, "worker_side_prioritization": True, "prioritized_replay_eps": 0.01,
        "worker_index": 1, "num_workers": 2})
    out = worker.postprocess_trajectory(batch)
    expected = np.abs(worker.compute_td_error(adjust_nstep(batch, 3, 0.99))) + 0.01
    np.testing.assert_allclose(out["weights"], expected, rtol=1e-6)
    assert (out["weights"] > 0.01).all()


def test_worker_target_follows_received_weights_learner_does_not() -> None:
    """set_weights syncs the target net on rollout workers, not on the learner."""
    torch.manual_seed(0)
    source = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {})
    weights = source.get_weights()
    worker = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {"worker_index": 1})
    learner = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), {"worker_index": 0})
    worker.set_weights(weights)
    learner.set_weights(weights)
    assert _same_weights(worker.target_model, source.model)
    assert not _same_weights(learner.target_model, source.model)
    assert not any(k.startswith("target") for k in weights)


def test_state_round_trip_keeps_target_and_counters() -> None:
    """get_state/set_state restore online and target weights and the sync counters."""
    torch.manual_seed(0)
    config = {"target_network_update_freq": 64, "model": {"fcnet_hiddens": [8]},
              "hiddens": [8]}
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), config)
    for _ in range(3):
        policy.learn_on_batch(_random_batch(32))
    state = policy.get_state()
    restored = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(2), config)
    restored.set_state(state)
    assert _same_weights(restored.model, policy.model)
    assert _same_weights(restored.target_model, policy.target_model)
    assert not _same_weights(restored.model, restored.target_model)
    assert (restored.num_steps_trained, restored.last_target_update_steps,
            restored.num_target_updates) == (96, 64, 1)


def test_conv_trunk_for_images() -> None:
    """Image observations get a conv trunk; uint8 pixels are accepted."""
    space = gym.spaces.Box(0, 255, (42, 42, 3), np.uint8)
    policy = DQNPolicy(space, gym.spaces.Discrete(4), {"hiddens": [32]})
    obs = np.random.default_rng(0).integers(0, 256, (5, 42, 42, 3), dtype=np.uint8)
    actions, _ = policy.compute_actions(obs, explore=False)
    assert actions.shape == (5,)
    assert any(isinstance(m, torch.nn.Conv2d) for m in policy.model.modules())


def test_invalid_config_names_the_key() -> None:
    """Bad values and unknown exploration keys are reported by name."""
    with pytest.raises(ValueError, match="n_step must be >= 1"):
        DQNPolicyConfig.load({"n_step": 0})
    with pytest.raises(ValueError, match="did you mean 'final_epsilon'"):
        DQNPolicyConfig.load({"exploration_config": {"final_epsilonn": 0.1}})
    with pytest.raises(ValueError, match="Discrete action space"):
        DQNPolicy(CARTPOLE_OBS, gym.spaces.Box(-1, 1, (2,)), {})


class TinyQModel(torch.nn.Module):
    """A catalog-style custom model: ``forward(obs) -> (q_values, value)``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int,
                 model_config: dict) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(int(np.prod(obs_space.shape)), num_outputs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.linear(obs.float())
        return q, torch.zeros(obs.shape[0])


def test_custom_model_outputs_are_q_values() -> None:
    """model.custom_model (class path) replaces the default network; its outputs are Q."""
    policy = DQNPolicy(CARTPOLE_OBS, gym.spaces.Discrete(3),
                       {"model": {"custom_model": f"{__name__}:TinyQModel"}})
    obs = torch.randn(4, 4)
    inner = policy.model.model
    assert isinstance(inner, TinyQModel)
    torch.testing.assert_close(policy.model(obs), inner.linear(obs))
    info = policy.learn_on_batch(_random_batch(8))
    assert info["td_error"].shape == (8,)


def run_dqn_cartpole(config: dict, seed: int, max_env_steps: int, target: float,
                     window: int = 20) -> tuple[int, list[float]]:
    """Single-process DQN: ``num_envs_per_worker`` gymnasium CartPoles stepped in lockstep,
    fragments of ``rollout_fragment_length`` postprocessed per env and added to a
    prioritized ReplayBuffer, ``training_intensity`` rows trained per env step with
    priorities updated from ``td_error``. Stops when the mean return of the last ``window``
    episodes reaches ``target``; returns the env steps used and all episode returns."""
    torch.manual_seed(seed)
    num_envs = config["num_envs_per_worker"]
    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    obs = np.stack([env.reset(seed=seed * 100 + i)[0] for i, env in enumerate(envs)])
    policy = DQNPolicy(envs[0].observation_space, envs[0].action_space,
                       {**config, "seed": seed})
    sampler = PrioritizedSampler(config["prioritized_replay_alpha"],
                                 config["prioritized_replay_beta"],
                                 config["prioritized_replay_eps"])
    buffer = ReplayBuffer(config["buffer_size"], sampler=sampler, seed=seed)
    names = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id")
    fragments: list[dict[str, list]] = [{k: [] for k in names} for _ in envs]
    episode_ids = list(range(num_envs))
    episode_return = np.zeros(num_envs)
    returns: list[float] = []
    env_steps, updates_due = 0, 0.0
    while env_steps < max_env_steps:
        actions, _ = policy.compute_actions(obs)
        for i, env in enumerate(envs):
            next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            row = (obs[i].copy(), next_obs, actions[i], reward, terminated, truncated,
                   episode_ids[i])
            for name, value in zip(names, row):
                fragments[i][name].append(value)
            episode_return[i] += reward
            done = terminated or truncated
            if done or len(fragments[i]["obs"]) >= config["rollout_fragment_length"]:
                batch = SampleBatch({k: np.array(v) for k, v in fragments[i].items()})
                buffer.add_batch(policy.postprocess_trajectory(batch))
                fragments[i] = {k: [] for k in names}
            if done:
                returns.append(float(episode_return[i]))
                episode_return[i] = 0.0
                next_obs, _ = env.reset()
                episode_ids[i] = max(episode_ids) + 1
            obs[i] = next_obs
        env_steps += num_envs
        if len(buffer) >= config["learning_starts"]:
            updates_due += num_envs * config["training_intensity"] / config["train_batch_size"]
            while updates_due >= 1.0:
                updates_due -= 1.0
                sample = buffer.sample(config["train_batch_size"])
                info = policy.learn_on_batch(sample)
                buffer.update_priorities(sample["batch_indexes"],
                                         sampler.priorities_of(info["td_error"]))
        if window_reached(returns, window, target):
            break
    return env_steps, returns


@pytest.mark.learning
def test_dqn_learns_cartpole() -> None:
    """With DQN_CARTPOLE and prioritized replay, the mean return of the last 20
    CartPole-v1 episodes reaches 150 within 20k env steps (7-9k for seeds 0-6)."""
    env_steps, returns = run_dqn_cartpole(DQN_CARTPOLE, seed=0,
                                          max_env_steps=20_000, target=150.0)
    assert_window_reached(returns, env_steps, 20, 150.0)
