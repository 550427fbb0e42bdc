"""RolloutWorker: batch sizes and order, episode modes, bootstrapping through time limits,
metrics, weights, gradients, seeding and multi-agent policy maps."""

from __future__ import annotations

import ast
import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch

import actorrl.rollout
import actorrl.rollout.samplers
import actorrl.rollout.worker
from actorrl.data.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from actorrl.envs import EnvContext, EpisodeMetrics, MultiAgentEnv
from actorrl.policy.actor_critic import ActorCriticPolicy
from actorrl.rollout import RolloutWorker

torch.set_num_threads(1)

SMALL_MODEL = {"fcnet_hiddens": [16]}


# ---- test envs -------------------------------------------------------------------------

class CountingEnv(gym.Env):
    """obs = [steps so far, vector index]; reward 1 per step; terminates after
    ``terminate_at`` steps when set."""

    def __init__(self, terminate_at: int | None, vector_index: int) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_at = terminate_at
        self.vector_index = vector_index
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        terminated = self.terminate_at is not None and self.steps >= self.terminate_at
        return self._obs(), 1.0, terminated, False, {}

    def _obs(self):
        return np.array([self.steps, self.vector_index], dtype=np.float32)


def counting_env(config: EnvContext) -> gym.Env:
    """CountingEnv under a TimeLimit. ``terminate_at`` / ``max_steps`` may be lists indexed
    by the env's vector index."""

    def pick(value):
        return value[config.vector_index] if isinstance(value, list) else value

    env = CountingEnv(pick(config.get("terminate_at")), config.vector_index)
    return gym.wrappers.TimeLimit(env, max_episode_steps=pick(config.get("max_steps", 1000)))


class RecordingBoxEnv(gym.Env):
    """1-D Box actions in [-0.1, 0.1]; remembers what it was given."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-0.1, 0.1, (1,), np.float32)

    def __init__(self) -> None:
        self.received: list[np.ndarray] = []

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.received.append(np.array(action))
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


RECORDING_ENVS: list[RecordingBoxEnv] = []


def recording_box_env(config: EnvContext) -> gym.Env:
    RECORDING_ENVS.append(RecordingBoxEnv())
    return RECORDING_ENVS[-1]


class PairEnv(MultiAgentEnv):
    """Simultaneous moves. "a" gets reward 1 per step and stays to the end (``length``
    steps, terminated); "b" gets 2 per step and terminates alone after ``b_length``."""

    possible_agents = ["a", "b"]
    observation_spaces = {a: gym.spaces.Box(-1e6, 1e6, (2,), np.float32) for a in "ab"}
    action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(3)}

    def __init__(self, config: EnvContext) -> None:
        self.length = config.get("length", 6)
        self.b_length = config.get("b_length", 3)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"a": self._obs(0), "b": self._obs(1)}, {}

    def step(self, actions):
        assert set(actions) == ({"a", "b"} if self.t < self.b_length else {"a"}), actions
        self.t += 1
        obs, rewards = {"a": self._obs(0)}, {"a": 1.0}
        terminateds = {"__all__": self.t >= self.length}
        if "b" in actions:
            obs["b"], rewards["b"] = self._obs(1), 2.0
            terminateds["b"] = self.t >= self.b_length
        return obs, rewards, terminateds, {"__all__": False}, {}

    def _obs(self, who: int):
        return np.array([self.t, who], dtype=np.float32)


class TurnEnv(MultiAgentEnv):
    """Turn-based: "x" acts at even t, "y" at odd t. Every step pays "x" t and "y" 10 t;
    the episode terminates at t = 5 with both agents observing."""

    possible_agents = ["x", "y"]
    observation_spaces = {a: gym.spaces.Box(-1e6, 1e6, (1,), np.float32) for a in "xy"}
    action_spaces = {a: gym.spaces.Discrete(2) for a in "xy"}

    def __init__(self, config: EnvContext) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"x": np.array([0.0], dtype=np.float32)}, {}

    def step(self, actions):
        assert list(actions) == (["x"] if self.t % 2 == 0 else ["y"]), actions
        self.t += 1
        done = self.t >= 5
        now = np.array([self.t], dtype=np.float32)
        if done:
            obs = {"x": now, "y": now}
        else:
            obs = {"y" if self.t % 2 else "x": now}
        rewards = {"x": float(self.t), "y": 10.0 * self.t}
        return obs, rewards, {"__all__": done}, {"__all__": False}, {}


def map_pair_agent(agent_id: str) -> str:
    return {"a": "pa", "b": "pb"}[agent_id]


class SmallModel(torch.nn.Module):
    """Custom model by class path: forward(obs) -> (outputs, value)."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.tag = model_config["custom_model_config"]["tag"]
        self.net = torch.nn.Linear(obs_space.shape[0], num_outputs + 1)

    def forward(self, obs):
        out = self.net(obs.float())
        return out[:, :-1], out[:, -1]


COUNTING = f"{__name__}:counting_env"


def counting_worker(*, seed: int = 0, worker_index: int = 0, **config) -> RolloutWorker:
    base = {"model": SMALL_MODEL, "seed": seed, "rollout_fragment_length": 5,
            "num_envs_per_worker": 2, "env_config": {"max_steps": 8}}
    return RolloutWorker(COUNTING, ActorCriticPolicy, {**base, **config},
                         worker_index=worker_index)


# ---- single-agent sampling -------------------------------------------------------------

def test_truncate_mode_gives_fragment_length_rows_per_env_grouped_by_env():
    worker = counting_worker(num_envs_per_worker=3, rollout_fragment_length=7,
                             env_config={"max_steps": 4})
    batch, count = worker.sample_with_count()
    assert isinstance(batch, SampleBatch) and count == batch.count == 21
    env_index = batch[SampleBatch.OBS][:, 1]
    assert env_index.tolist() == [0] * 7 + [1] * 7 + [2] * 7
    # within an env: time order, episodes of 4 steps, t restarting at 0
    assert batch[SampleBatch.T][:7].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert batch[SampleBatch.TRUNCATEDS][:7].tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert worker.num_env_steps_sampled == 21


def test_truncate_mode_continues_episodes_across_samples():
    worker = counting_worker(num_envs_per_worker=1, rollout_fragment_length=3)
    first, second = worker.sample(), worker.sample()
    assert first[SampleBatch.T].tolist() == [0, 1, 2]
    assert second[SampleBatch.T].tolist() == [3, 4, 5]
    assert first[SampleBatch.EPS_ID][0] == second[SampleBatch.EPS_ID][0]
    assert np.array_equal(first[SampleBatch.NEXT_OBS][-1], second[SampleBatch.OBS][0])


def test_complete_episodes_mode_returns_whole_episodes_only():
    worker = counting_worker(batch_mode="complete_episodes", rollout_fragment_length=10,
                             num_envs_per_worker=2, env_config={"max_steps": 7})
    for _ in range(3):
        batch = worker.sample()
        assert batch.count >= 20 and batch.count % 7 == 0
        episodes = batch.split_by_episode()
        assert len(episodes) == batch.count // 7
        for episode in episodes:
            assert episode[SampleBatch.T].tolist() == list(range(7))
            assert episode[SampleBatch.TRUNCATEDS].tolist() == [False] * 6 + [True]


def test_bootstrapping_through_time_limits():
    """Value targets of the last step: reward only when terminated, reward plus the
    discounted value of the final observation when truncated or cut."""
    gamma = 0.9
    worker = counting_worker(num_envs_per_worker=2, rollout_fragment_length=4, gamma=gamma,
                             env_config={"terminate_at": [4, None], "max_steps": [100, 4]})
    policy = worker.get_policy()
    batch = worker.sample()
    terminated_env, truncated_env = batch.slice(0, 4), batch.slice(4, 8)
    assert terminated_env[SampleBatch.TERMINATEDS][-1]
    assert not terminated_env[SampleBatch.TRUNCATEDS][-1]
    assert truncated_env[SampleBatch.TRUNCATEDS][-1]
    assert not truncated_env[SampleBatch.TERMINATEDS][-1]
    assert terminated_env[SampleBatch.VALUE_TARGETS][-1] == pytest.approx(1.0)
    final_value = policy.compute_values(truncated_env[SampleBatch.NEXT_OBS][-1:])[0]
    assert abs(final_value) > 1e-3
    assert truncated_env[SampleBatch.VALUE_TARGETS][-1] == pytest.approx(
        1.0 + gamma * final_value, rel=1e-5)
    # a fragment cut mid-episode bootstraps too
    cut = counting_worker(num_envs_per_worker=1, rollout_fragment_length=3, gamma=gamma,
                          env_config={"terminate_at": 10}).sample()
    assert not cut[SampleBatch.TERMINATEDS][-1] and not cut[SampleBatch.TRUNCATEDS][-1]
    cut_policy_value = policy.compute_values(cut[SampleBatch.NEXT_OBS][-1:])[0]
    assert cut[SampleBatch.VALUE_TARGETS][-1] == pytest.approx(
        1.0 + gamma * cut_policy_value, rel=1e-5)


def test_metrics_are_collected_per_worker_and_merge():
    workers = [counting_worker(worker_index=i, rollout_fragment_length=10,
                               env_config={"max_steps": 4}) for i in range(2)]
    for worker in workers:
        worker.sample()
    merged = EpisodeMetrics.merge([w.get_metrics() for w in workers])
    # 2 workers x 2 envs x 10 steps with episodes of 4 steps -> 2 episodes per env
    assert merged.episode_lengths == [4] * 8 and merged.episode_rewards == [4.0] * 8
    assert merged.summary()["episodes_this_iter"] == 8
    assert workers[0].get_metrics().num_episodes == 0  # drained by the previous call


def test_same_seed_same_batches_other_worker_index_differs():
    def first_batch(worker_index: int) -> SampleBatch:
        return RolloutWorker("CartPole-v1", ActorCriticPolicy,
                             {"model": SMALL_MODEL, "seed": 4, "rollout_fragment_length": 20,
                              "num_envs_per_worker": 2}, worker_index=worker_index).sample()

    a, b = first_batch(1), first_batch(1)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert not np.array_equal(a[SampleBatch.OBS], first_batch(2)[SampleBatch.OBS])


@pytest.mark.parametrize("mode", ["normalize", "clip", "raw"])
def test_box_actions_reach_the_env_transformed_but_are_stored_as_sampled(mode):
    RECORDING_ENVS.clear()
    worker = RolloutWorker(f"{__name__}:recording_box_env", ActorCriticPolicy,
                           {"model": SMALL_MODEL, "seed": 0, "rollout_fragment_length": 20,
                            "normalize_actions": mode == "normalize",
                            "clip_actions": mode == "clip"})
    batch = worker.sample()
    stored = batch[SampleBatch.ACTIONS]
    assert stored.shape == (20, 1) and np.abs(stored).max() > 0.1
    received = np.concatenate(RECORDING_ENVS[0].received)
    expected = {"normalize": np.clip(-0.1 + (stored[:, 0] + 1.0) * 0.1, -0.1, 0.1),
                "clip": np.clip(stored[:, 0], -0.1, 0.1), "raw": stored[:, 0]}[mode]
    np.testing.assert_allclose(received, expected, rtol=1e-6, atol=1e-7)
    # the stored action is what the policy sampled: its logp is the recorded one
    policy = worker.get_policy()
    dist = policy.dist_class(torch.as_tensor(batch[SampleBatch.ACTION_DIST_INPUTS]))
    np.testing.assert_allclose(dist.logp(torch.as_tensor(stored)).numpy(),
                               batch[SampleBatch.ACTION_LOGP], rtol=1e-5, atol=1e-5)


def test_custom_model_by_class_path_through_the_worker():
    worker = counting_worker(model={"custom_model": f"{__name__}:SmallModel",
                                    "custom_model_config": {"tag": "mine"}})
    model = worker.get_policy().model
    assert isinstance(model, SmallModel) and model.tag == "mine"
    assert worker.sample().count == 10


# ---- weights and gradients -------------------------------------------------------------

def test_weights_round_trip_between_workers():
    source, target = counting_worker(seed=1), counting_worker(seed=2)
    weights = source.get_weights()
    assert set(weights) == {DEFAULT_POLICY_ID}
    assert not all(np.array_equal(v, target.get_weights()[DEFAULT_POLICY_ID][k])
                   for k, v in weights[DEFAULT_POLICY_ID].items())
    target.set_weights(weights, global_timestep=123)
    for name, value in target.get_weights()[DEFAULT_POLICY_ID].items():
        assert np.array_equal(value, weights[DEFAULT_POLICY_ID][name]), name
    assert target.get_policy().global_timestep == 123
    # get_weights returns copies: changing them leaves the policy alone
    next(iter(weights[DEFAULT_POLICY_ID].values()))[...] = 42.0
    assert not np.array_equal(next(iter(source.get_weights()[DEFAULT_POLICY_ID].values())),
                              next(iter(weights[DEFAULT_POLICY_ID].values())))


def test_compute_apply_gradients_equals_learn_on_batch():
    a, b = counting_worker(seed=5, lr=0.01), counting_worker(seed=5, lr=0.01)
    for _ in range(3):
        batch = a.sample()
        grads, info = a.compute_gradients(batch)
        assert isinstance(grads, list) and info["batch_count"] == batch.count
        a.apply_gradients(grads)
        learn_info = b.learn_on_batch(batch)
        assert set(learn_info) == {DEFAULT_POLICY_ID}
        assert "policy_loss" in learn_info[DEFAULT_POLICY_ID]["learner_stats"]
    for name, value in a.get_weights()[DEFAULT_POLICY_ID].items():
        np.testing.assert_allclose(value, b.get_weights()[DEFAULT_POLICY_ID][name], atol=1e-7)


def test_set_global_timestep_reaches_every_policy():
    worker = counting_worker()
    worker.set_global_timestep(77)
    assert worker.foreach_policy(lambda p, pid: (pid, p.global_timestep)) == [
        (DEFAULT_POLICY_ID, 77)]


# ---- multi-agent -----------------------------------------------------------------------

def pair_worker(batch_mode: str = "truncate_episodes", **multiagent) -> RolloutWorker:
    """Two PairEnvs; "a" -> policy "pa" (the default class), "b" -> "pb" (own lr)."""
    config = {
        "model": SMALL_MODEL, "seed": 0, "rollout_fragment_length": 5, "batch_mode": batch_mode,
        "num_envs_per_worker": 2, "env_config": {"length": 6, "b_length": 3},
        "multiagent": {
            "policies": {"pa": (None, None, None, {}),
                         "pb": (ActorCriticPolicy, None, None, {"lr": 0.5})},
            "policy_mapping_fn": f"{__name__}:map_pair_agent",
            **multiagent,
        },
    }
    return RolloutWorker(f"{__name__}:PairEnv", ActorCriticPolicy, config, worker_index=1,
                         num_workers=3)


def test_multi_agent_policy_map_spaces_and_overrides():
    worker = pair_worker()
    pa, pb = worker.get_policy("pa"), worker.get_policy("pb")
    assert pa.action_space == gym.spaces.Discrete(2) and pb.action_space == gym.spaces.Discrete(3)
    assert pb.config.lr == 0.5 and pa.config.lr != 0.5
    assert worker.worker_index == 1 and worker.num_workers == 3
    with pytest.raises(KeyError, match="no policy 'pc'.*'pa', 'pb'"):
        worker.get_policy("pc")


def test_multi_agent_sample_truncate_mode():
    batch = pair_worker().sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.count == 10  # env steps: 5 per env x 2 envs
    pa, pb = batch.policy_batches["pa"], batch.policy_batches["pb"]
    assert pa.count == 10 and pb.count == 6  # "b" leaves after 3 steps of its episode
    b_first_env = pb[SampleBatch.EPS_ID] == pb[SampleBatch.EPS_ID][0]
    assert pb[SampleBatch.TERMINATEDS][b_first_env].tolist() == [False, False, True]
    assert pb[SampleBatch.REWARDS].tolist() == [2.0] * 6
    assert pb[SampleBatch.ACTIONS].max() <= 2 and SampleBatch.ADVANTAGES in pb
    assert pb[SampleBatch.VALUE_TARGETS][b_first_env][-1] == pytest.approx(2.0)
    # "a" is cut after 5 of its 6 steps: no terminal flag yet
    assert not pa[SampleBatch.TERMINATEDS].any() and not pa[SampleBatch.TRUNCATEDS].any()


def test_multi_agent_complete_episodes():
    worker = pair_worker(batch_mode="complete_episodes")
    batch = worker.sample()
    assert batch.count >= 10 and batch.count % 6 == 0
    pa = batch.policy_batches["pa"]
    assert pa.count == batch.count
    assert pa[SampleBatch.TERMINATEDS].sum() == batch.count // 6
    assert worker.get_metrics().episode_rewards[:2] == [12.0, 12.0]  # 6 * 1 + 3 * 2


def test_multi_agent_policies_to_train():
    worker = pair_worker(policies_to_train=["pa"])
    batch = worker.sample()
    before = worker.get_weights()
    info = worker.learn_on_batch(batch)
    assert set(info) == {"pa"}
    after = worker.get_weights()
    assert any(not np.array_equal(before["pa"][k], after["pa"][k]) for k in before["pa"])
    assert all(np.array_equal(before["pb"][k], after["pb"][k]) for k in before["pb"])
    grads, grad_info = worker.compute_gradients(batch)
    assert set(grads) == {"pa"} and grad_info["batch_count"] == batch.count
    assert grad_info["pa"]["batch_count"] == batch.policy_batches["pa"].count
    worker.apply_gradients(grads)
    assert worker.foreach_trainable_policy(lambda p, pid: pid) == ["pa"]
    assert worker.foreach_policy(lambda p, pid: pid) == ["pa", "pb"]


def test_multi_agent_gradients_match_learn_on_batch():
    a, b = pair_worker(), pair_worker()
    batch = a.sample()
    grads, _ = a.compute_gradients(batch)
    a.apply_gradients(grads)
    b.learn_on_batch(batch)
    for pid in ("pa", "pb"):
        for name, value in a.get_weights()[pid].items():
            np.testing.assert_allclose(value, b.get_weights()[pid][name], atol=1e-7)


def test_turn_based_rewards_accumulate_until_the_agent_observes_again():
    worker = RolloutWorker(
        f"{__name__}:TurnEnv", ActorCriticPolicy,
        {"model": SMALL_MODEL, "seed": 0, "batch_mode": "complete_episodes",
         "rollout_fragment_length": 5,
         "multiagent": {"policies": {"shared": (None, None, None, {})}}})
    batch = worker.sample().policy_batches["shared"]
    x = batch.take(np.flatnonzero(batch[SampleBatch.AGENT_INDEX] == 0))
    y = batch.take(np.flatnonzero(batch[SampleBatch.AGENT_INDEX] == 1))
    assert x[SampleBatch.OBS][:, 0].tolist() == [0, 2, 4]
    assert x[SampleBatch.NEXT_OBS][:, 0].tolist() == [2, 4, 5]
    assert x[SampleBatch.REWARDS].tolist() == [1 + 2, 3 + 4, 5]
    assert x[SampleBatch.TERMINATEDS].tolist() == [False, False, True]
    assert y[SampleBatch.OBS][:, 0].tolist() == [1, 3]
    assert y[SampleBatch.NEXT_OBS][:, 0].tolist() == [3, 5]
    assert y[SampleBatch.REWARDS].tolist() == [20 + 30, 40 + 50]
    assert y[SampleBatch.TERMINATEDS].tolist() == [False, True]
    assert worker.get_metrics().episode_rewards == [sum(11.0 * t for t in range(1, 6))]


# ---- configuration errors ---------------------------------------------------------------

@pytest.mark.parametrize("config, message", [
    ({"batch_mode": "whole"}, "batch_mode must be .truncate_episodes. or"),
    ({"rollout_fragment_length": 0}, "rollout_fragment_length must be an int >= 1, got 0"),
    ({"multiagent": {"policy": {}}}, "unknown multiagent key"),
    ({"multiagent": {"policies": {"p": (None, None, None, {})}}},
     "multiagent.policies is set but env makes single-agent"),
])
def test_bad_worker_config_is_rejected(config, message):
    with pytest.raises(ValueError, match=message):
        RolloutWorker("CartPole-v1", ActorCriticPolicy, config)


def test_multi_agent_config_errors():
    with pytest.raises(ValueError, match="set multiagent.policies"):
        RolloutWorker(f"{__name__}:PairEnv", ActorCriticPolicy, {})
    with pytest.raises(ValueError, match="policies_to_train names unknown policies \\['pz'\\]"):
        pair_worker(policies_to_train=["pz"])
    with pytest.raises(ValueError, match="policy_mapping_fn is needed"):
        pair_worker(policy_mapping_fn=None)
    worker = pair_worker(policy_mapping_fn=lambda agent_id: "pa" if agent_id == "a" else "zz",
                         policies={"pa": (None, None, None, {}),
                                   "pb": (None, PairEnv.observation_spaces["b"],
                                          PairEnv.action_spaces["b"], {})})
    with pytest.raises(ValueError, match="policy_mapping_fn\\('b'\\) returned 'zz'"):
        worker.sample()


def test_rollout_module_imports_neither_asyncio_nor_transport():
    imported = set()
    for module in (actorrl.rollout, actorrl.rollout.worker, actorrl.rollout.samplers):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
    assert "numpy" in imported, imported
    assert imported.isdisjoint({"asyncio", "transport", "zmq"}), imported
