"""Env creation, manual-reset vectorization, seeding and episode metrics."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from actorrl.envs import (
    EnvContext,
    EpisodeMetrics,
    EpisodeWindow,
    MultiAgentEnv,
    MultiAgentVectorEnv,
    VectorEnv,
    make_env,
    make_vector_env,
)
from transport.codec import decode, encode


class CountingEnv(gym.Env):
    """obs = [steps so far, seed of the last seeded reset]; reward = 1 per step; terminates
    after ``terminate_at`` steps (if set)."""

    def __init__(self, terminate_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_at = terminate_at
        self.steps = 0
        self.seed_used = -1.0
        self.actions: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed_used = float(seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        self.actions.append(action)
        self.steps += 1
        terminated = self.terminate_at is not None and self.steps >= self.terminate_at
        return self._obs(), 1.0, terminated, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.steps, self.seed_used], dtype=np.float32)


def counting_env_factory(config: EnvContext) -> gym.Env:
    """CountingEnv under a TimeLimit of ``config['max_steps']``."""
    env = CountingEnv(config.get("terminate_at"))
    return gym.wrappers.TimeLimit(env, max_episode_steps=config.get("max_steps", 1000))


def context_recording_factory(config: EnvContext) -> gym.Env:
    env = CountingEnv()
    env.context = (dict(config), config.worker_index, config.vector_index, config.num_workers)
    return env


def not_an_env_factory(config: EnvContext) -> str:
    return "nope"


FACTORY = f"{__name__}:counting_env_factory"


# ---- make_env ------------------------------------------------------------------------

def test_make_env_from_gymnasium_id_passes_env_config_as_make_kwargs():
    env = make_env("CartPole-v1", {"max_episode_steps": 7})
    env.reset(seed=0)
    for step in range(1, 8):
        _, _, terminated, truncated, _ = env.step(0 if step % 2 else 1)
        if terminated:
            pytest.fail("CartPole alternating actions should not fall within 7 steps")
    assert truncated


def test_unknown_gymnasium_id_suggests_close_matches():
    with pytest.raises(ValueError, match="unknown environment id 'CartPol-v1'.*CartPole-v1"):
        make_env("CartPol-v1")


def test_factory_path_gets_env_context():
    env = make_env(f"{__name__}:context_recording_factory", {"a": 1}, worker_index=3,
                   vector_index=2, num_workers=4)
    assert env.context == ({"a": 1}, 3, 2, 4)


def test_callable_factory_is_used_directly():
    env = make_env(counting_env_factory, {"max_steps": 3})
    assert isinstance(env, gym.wrappers.TimeLimit)


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:factory", "cannot import module 'no_such_module_xyz'"),
    (f"{__name__}:counting_env_factori", "has no attribute 'counting_env_factori'.*"
                                         "did you mean counting_env_factory"),
    (f"{__name__}:not_an_env_factory", "returned str, expected a gymnasium.Env"),
    (f"{__name__}:FACTORY", "is a str, not a callable"),
])
def test_bad_factory_paths_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        make_env(spec)


def test_gymnasium_module_colon_id_form():
    env = make_env("gymnasium.envs.classic_control:CartPole-v1")
    assert env.spec.id == "CartPole-v1"


# ---- VectorEnv -----------------------------------------------------------------------

def test_minatar_ids_register_on_first_use_and_give_10x10_planes():
    """MinAtar ids work like gymnasium's own: registered when first named, bool planes
    stepped as the MinAtar paper does (full action set for -v0)."""
    env = make_env("MinAtar/Breakout-v0")
    obs, _ = env.reset(seed=0)
    assert env.observation_space.shape == (10, 10, 4) and env.action_space.n == 6
    assert obs.shape == (10, 10, 4) and obs.dtype.kind in "bu" and obs.any()
    assert make_env("MinAtar/SpaceInvaders-v1").action_space.n == 4  # minimal action set
    with pytest.raises(ValueError, match="did you mean MinAtar/Breakout-v0"):
        make_env("MinAtar/Breakuot-v0")


def test_minatar_ids_without_the_package_name_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "minatar.gym", None)
    for name in [n for n in gym.envs.registry if n.startswith("MinAtar/")]:
        monkeypatch.delitem(gym.envs.registry, name)
    with pytest.raises(ValueError, match=r"minatar package.*\[minatar\]"):
        make_env("MinAtar/Breakout-v0")


def test_vector_env_resets_by_hand_and_keeps_final_obs():
    """A finished env's row in ``next_obs`` is its final observation, in ``obs`` the first
    observation of the next episode; terminated and truncated are told apart."""
    envs = [counting_env_factory(EnvContext({"terminate_at": 2, "max_steps": 10})),
            counting_env_factory(EnvContext({"max_steps": 3}))]
    venv = VectorEnv(envs)
    obs = venv.reset()
    assert obs[:, 0].tolist() == [0, 0]
    step = venv.step(np.array([0, 1]))
    assert step.next_obs[:, 0].tolist() == [1, 1] and step.obs[:, 0].tolist() == [1, 1]
    assert not step.dones.any()
    step = venv.step(np.array([0, 1]))
    assert step.terminateds.tolist() == [True, False]
    assert step.truncateds.tolist() == [False, False]
    assert step.next_obs[:, 0].tolist() == [2, 2]
    assert step.obs[:, 0].tolist() == [0, 2]
    step = venv.step(np.array([0, 1]))
    assert step.terminateds.tolist() == [False, False]
    assert step.truncateds.tolist() == [False, True]
    assert step.next_obs[:, 0].tolist() == [1, 3]
    assert step.obs[:, 0].tolist() == [1, 0]
    assert step.rewards.dtype == np.float32
    metrics = venv.pop_metrics()
    assert metrics.episode_rewards == [2.0, 3.0] and metrics.episode_lengths == [2, 3]
    assert venv.pop_metrics().num_episodes == 0


def test_vector_env_passes_discrete_actions_as_python_ints():
    envs = [CountingEnv(), CountingEnv()]
    venv = VectorEnv(envs)
    venv.reset()
    venv.step(np.array([1, 0]))
    venv.step([0, 1])
    assert envs[0].actions == [1, 0] and type(envs[0].actions[0]) is int


def test_env_seeds_depend_on_worker_and_env_index_and_apply_once():
    venv = make_vector_env(FACTORY, {}, num_envs=3, worker_index=2, seed=10)
    obs = venv.reset()
    assert obs[:, 1].tolist() == [2010, 2011, 2012]
    envs = [e.unwrapped for e in venv.envs]
    for env in envs:
        env.seed_used = -1.0
    venv.reset()
    assert [e.seed_used for e in envs] == [-1.0, -1.0, -1.0]


def test_same_seed_gives_same_cartpole_trajectories():
    def rollout(worker_index: int) -> np.ndarray:
        venv = make_vector_env("CartPole-v1", num_envs=2, worker_index=worker_index, seed=5)
        out = [venv.reset()]
        for _ in range(30):
            out.append(venv.step(np.array([0, 1])).obs)
        return np.stack(out)

    assert np.array_equal(rollout(1), rollout(1))
    assert not np.array_equal(rollout(1), rollout(2))


def test_make_vector_env_rejects_zero_envs():
    with pytest.raises(ValueError, match="num_envs_per_worker must be >= 1"):
        make_vector_env("CartPole-v1", num_envs=0)


# ---- episode metrics -----------------------------------------------------------------

def test_episode_metrics_summary_and_merge_are_exact():
    a = EpisodeMetrics()
    a.record(10.0, 10)
    a.record(30.0, 20)
    b = EpisodeMetrics([50.0], [60])
    merged = EpisodeMetrics.merge([a, b])
    assert merged.summary() == {
        "episode_reward_mean": 30.0, "episode_reward_min": 10.0, "episode_reward_max": 50.0,
        "episode_len_mean": 30.0, "episodes_this_iter": 3,
        "policy_reward_mean": {}, "policy_reward_min": {}, "policy_reward_max": {},
    }
    assert a.num_episodes == 2  # inputs untouched


def test_empty_metrics_summary_is_nan():
    summary = EpisodeMetrics().summary()
    assert math.isnan(summary["episode_reward_mean"]) and summary["episodes_this_iter"] == 0


def test_episode_metrics_cross_the_codec():
    metrics = EpisodeMetrics([1.5, 2.5], [3, 4])
    assert decode(encode(metrics)) == metrics


def test_episode_window_tops_up_with_history_like_rllib():
    window = EpisodeWindow(smoothing_episodes=3)
    first = window.update(EpisodeMetrics([1.0, 2.0], [1, 2]))
    assert first["episode_reward_mean"] == 1.5 and first["episodes_this_iter"] == 2
    # one new episode: topped up with the two most recent earlier ones
    second = window.update(EpisodeMetrics([6.0], [6]))
    assert second["episode_reward_mean"] == 3.0 and second["episodes_this_iter"] == 1
    # more new episodes than the window: all new ones count, none from history
    third = window.update(EpisodeMetrics([10.0, 20.0, 30.0, 40.0], [1, 1, 1, 1]))
    assert third["episode_reward_mean"] == 25.0 and third["episode_reward_min"] == 10.0
    # no new episodes: the last three
    fourth = window.update(EpisodeMetrics())
    assert fourth["episode_reward_mean"] == 30.0 and fourth["episodes_this_iter"] == 0


def test_episode_window_keeps_every_episode_while_history_is_shorter_than_it():
    """Fewer episodes than the window so far: all of them count (the history is not cut
    to the window minus the new ones)."""
    window = EpisodeWindow(smoothing_episodes=100)
    window.update(EpisodeMetrics([-1000.0] * 60, [200] * 60))
    second = window.update(EpisodeMetrics([0.0] * 3, [200] * 3))
    assert second["episode_reward_mean"] == pytest.approx(-60000.0 / 63)
    assert second["episodes_this_iter"] == 3


def test_episode_window_rejects_bad_size():
    with pytest.raises(ValueError, match="metrics_smoothing_episodes must be >= 1"):
        EpisodeWindow(0)


# ---- multi-agent vector env -----------------------------------------------------------

class TwoAgentCounter(MultiAgentEnv):
    """Agents "a" and "b" each get reward 1 ("b": 2) per step; the episode ends after
    ``length`` steps (``missing_all`` leaves "__all__" out, which is an error)."""

    possible_agents = ["a", "b"]
    observation_spaces = {a: gym.spaces.Box(-1e9, 1e9, (1,), np.float32) for a in "ab"}
    action_spaces = {a: gym.spaces.Discrete(2) for a in "ab"}

    def __init__(self, length: int = 3, missing_all: bool = False) -> None:
        self.length = length
        self.missing_all = missing_all
        self.t = 0
        self.reset_seeds: list[int | None] = []

    def reset(self, *, seed=None, options=None):
        self.reset_seeds.append(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, actions):
        self.t += 1
        terminateds = {} if self.missing_all else {"__all__": self.t >= self.length}
        truncateds = {} if self.missing_all else {"__all__": False}
        return self._obs(), {"a": 1.0, "b": 2.0}, terminateds, truncateds, {}

    def _obs(self):
        return {a: np.array([self.t], dtype=np.float32) for a in "ab"}


def test_multi_agent_vector_env_resets_and_sums_agent_rewards():
    envs = [TwoAgentCounter(2), TwoAgentCounter(3)]
    venv = make_vector_env(lambda ctx: envs[ctx.vector_index], num_envs=2, seed=7)
    assert isinstance(venv, MultiAgentVectorEnv)
    venv.reset()
    assert [e.reset_seeds for e in envs] == [[7], [8]]
    venv.step([{"a": 0, "b": 0}] * 2)
    steps = venv.step([{"a": 0, "b": 0}] * 2)
    assert steps[0].episode_done and steps[0].reset_obs["a"].tolist() == [0]
    assert steps[0].obs["a"].tolist() == [2]
    assert not steps[1].episode_done and steps[1].reset_obs is None
    # No sampler named the agents' policies: no per-policy rewards for the episode.
    assert venv.pop_metrics() == EpisodeMetrics([6.0], [2], [[]])
    assert envs[0].reset_seeds == [7, None]


def test_multi_agent_step_without_all_key_is_an_error():
    venv = MultiAgentVectorEnv([TwoAgentCounter(missing_all=True)])
    venv.reset()
    with pytest.raises(ValueError, match="'__all__' key"):
        venv.step([{"a": 0, "b": 0}])


def test_catch_frames_show_ball_and_paddle():
    """The pixel env of the pixel learning tests draws ball and paddle (moved here from
    test_learning_pixels.py: it trains nothing)."""
    from actorrl.envs.custom.pixel import Catch

    env = Catch(rows=6, columns=4, scale=2)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (12, 8, 1) and obs.dtype.name == "uint8"
    assert int((obs > 0).sum()) == 2 * 4  # two cells, each 2x2 pixels
    total, done = 0.0, False
    while not done:
        obs, reward, done, _, _ = env.step(1)
        total += reward
    assert total in (-1.0, 1.0)
    assert Catch(channels_first=True).reset(seed=0)[0].shape == (1, 10, 5)
    with pytest.raises(ValueError, match="rows >= 3"):
        Catch(rows=2)


def test_rllib_example_envs_read_the_env_config_form_rllibs_files_write():
    """RLlib builds a class-path env with ``from_config(path, env_config)``: env_config's keys
    are the constructor's keyword arguments, so its tuned files write
    ``env_config: {config: {num_agents: 4}}`` for ``MultiAgentCartPole(config={...})``.
    Read literally, that dict has no ``num_agents`` and the 4-agent file trained one agent
    (and RepeatAfterMe ran with delay 1, not the file's 2)."""
    from actorrl.envs.custom.multi_agent import MultiAgentCartPole
    from actorrl.envs.custom.rllib_examples import (
        RandomLargeObsSpaceEnv,
        RepeatAfterMeEnv,
        constructor_config,
    )

    assert MultiAgentCartPole({"config": {"num_agents": 4}}).possible_agents == [0, 1, 2, 3]
    assert MultiAgentCartPole({"num_agents": 2}).possible_agents == [0, 1]
    assert RepeatAfterMeEnv({"config": {"repeat_delay": 2}}).delay == 2
    assert RepeatAfterMeEnv({"repeat_delay": 3}).delay == 3
    env = RandomLargeObsSpaceEnv({"config": {"p_terminated": 1.0}})
    assert env.p_terminated == 1.0 and env.observation_space.shape == (5000,)
    # Only the one-key form is unwrapped: a config that merely has a "config" key stays.
    assert constructor_config({"config": {"a": 1}, "b": 2}) == {"config": {"a": 1}, "b": 2}
    assert constructor_config({"config": 3}) == {"config": 3}
    assert constructor_config(None) == {}
