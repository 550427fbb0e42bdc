"""Atari preprocessing: each DeepMind wrapper against a scripted fake ALE env, and the whole
stack on real ale-py games (ROMs ship with ale-py: no download)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from actorrl.envs import VectorEnv, make_env
from actorrl.envs.atari import (
    GAME_OVER,
    GAME_REWARD,
    AtariOptions,
    ClipReward,
    EpisodicLife,
    FireReset,
    FrameStack,
    MaxAndSkip,
    NoopReset,
    WarpFrame,
    is_atari_id,
)
from tests.helpers.extras import installed


class FakeAle(gym.Env):
    """Frames numbered by step (every pixel = frame index % 256), scripted rewards and
    lives: a life is lost every ``life_every`` frames, the game ends with the last life."""

    def __init__(self, lives: int = 3, life_every: int = 10, shape=(6, 5)) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.start_lives = lives
        self.life_every = life_every
        self.ale = SimpleNamespace(lives=lambda: self._lives)
        self.actions: list[int] = []
        self.resets = 0

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def _frame(self) -> np.ndarray:
        return np.full(self.observation_space.shape, self.t % 256, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._lives = self.start_lives
        self.resets += 1
        return self._frame(), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        if self.t % self.life_every == 0:
            self._lives -= 1
        reward = 3.0 if self.t % 7 == 0 else 0.0
        return self._frame(), reward, self._lives == 0, False, {}


def test_max_and_skip_repeats_the_action_pools_the_last_two_frames_and_sums_rewards():
    env = MaxAndSkip(FakeAle(lives=100, life_every=1000), skip=4)
    env.reset(seed=0)
    total = 0.0
    for step in range(1, 4):
        obs, reward, *_ = env.step(2)
        assert np.all(obs == 4 * step)  # max(frame 4s-1, frame 4s)
        total += reward
    assert env.unwrapped.actions == [2] * 12
    assert total == 3.0  # frame 7 only (frame 14 not reached)


def test_episodic_life_ends_learning_episodes_per_life_but_resets_the_game_only_at_its_end():
    base = FakeAle(lives=3, life_every=5)
    env = EpisodicLife(base)
    env.reset(seed=0)
    ends = []
    for _ in range(40):
        _, _, terminated, _, info = env.step(0)
        if terminated:
            ends.append((base.t, info[GAME_OVER]))
            env.reset()
            if info[GAME_OVER]:
                break
    # lives lost at frames 5 and 10 (each reset steps one no-op, shifting later losses)
    assert [over for _, over in ends] == [False, False, True]
    assert base.resets == 2  # the first reset and the one after the game ended
    disabled = EpisodicLife(FakeAle(lives=3, life_every=5), enabled=False)
    disabled.reset(seed=0)
    terminations = [disabled.step(0)[2] for _ in range(14)]
    assert not any(terminations)


def test_clip_reward_learns_signs_and_reports_game_scores():
    env = ClipReward(FakeAle(lives=100, life_every=1000))
    env.reset(seed=0)
    seen = [env.step(0) for _ in range(7)]
    assert seen[6][1] == 1.0 and seen[6][4][GAME_REWARD] == 3.0
    raw = ClipReward(FakeAle(lives=100, life_every=1000), enabled=False)
    raw.reset(seed=0)
    assert [raw.step(0)[1] for _ in range(7)][-1] == 3.0


def test_noop_and_fire_reset_take_their_actions():
    base = FakeAle(lives=100, life_every=1000)
    env = NoopReset(base, noop_max=5)
    env.reset(seed=3)
    assert 1 <= len(base.actions) <= 5 and set(base.actions) == {0}
    fire_base = FakeAle(lives=100, life_every=1000)
    FireReset(fire_base).reset(seed=0)
    assert fire_base.actions == [1, 2]


def test_frame_stack_fills_with_the_first_frame_and_keeps_channel_order():
    env = FrameStack(WarpFrame(FakeAle(lives=100, life_every=1000, shape=(12, 10)), 8), 3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (8, 8, 3) and obs.dtype == np.uint8 and np.all(obs == 0)
    obs, *_ = env.step(0)
    assert [int(obs[0, 0, c]) for c in range(3)] == [0, 0, 1]
    chw = FrameStack(WarpFrame(FakeAle(lives=100, life_every=1000, shape=(12, 10)), 8), 3,
                     channels_first=True)
    chw.reset(seed=0)
    obs, *_ = chw.step(0)
    assert obs.shape == (3, 8, 8) and [int(obs[c, 0, 0]) for c in range(3)] == [0, 0, 1]
    assert env.observation_space.shape == (8, 8, 3)
    assert chw.observation_space.shape == (3, 8, 8)


def test_options_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="did you mean 'frame_skip'"):
        AtariOptions.from_env_config({"frame_skp": 2})
    with pytest.raises(ValueError, match="frame_stack must be >= 1"):
        AtariOptions.from_env_config({"frame_stack": 0})
    with pytest.raises(ValueError, match="preprocessing must be"):
        AtariOptions.from_env_config({"preprocessing": "rllib"})


def test_atari_ids_are_recognised():
    assert is_atari_id("ALE/Pong-v5")
    assert not is_atari_id("CartPole-v1")
    assert not is_atari_id("mypkg.mod:factory")


needs_ale = pytest.mark.skipif(not installed("ale_py"),
                               reason="the atari extra (ale-py) is not installed")
"""For the tests that run real games; the wrapper tests above run without the extra."""


@needs_ale
@pytest.mark.skipif(not installed("moviepy") and not os.environ.get("ACTORRL_CI"),
                    reason="the video extra (moviepy) is not installed")
def test_atari_episodes_record_the_full_colour_screen(tmp_path):
    """With render_mode rgb_array (what --video and record_env ask for) an Atari env renders
    the ALE's 210x160 colour screen beneath the preprocessed observations, and its
    episode is recorded frame by frame."""
    import imageio.v3 as iio

    from actorrl.envs.video import record_episodes, rgb_array_config

    env = make_env("PongNoFrameskip-v4", rgb_array_config({"frame_size": 42}))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (42, 42, 4) and env.render().shape == (210, 160, 3)
    env = record_episodes(env, str(tmp_path), "pong")
    env.reset(seed=0)
    for _ in range(30):
        env.step(env.action_space.sample())
    env.close()
    [video] = tmp_path.glob("*.mp4")
    frames = iio.imread(video)
    assert frames.shape[1:] == (210, 160, 3) and 25 <= len(frames) <= 35


@needs_ale
def test_gymnasiums_module_qualified_atari_id_gets_deepmind_preprocessing():
    """gymnasium's ``ale_py:ALE/Pong-v5`` is the same game as ``ALE/Pong-v5``: recognised as
    Atari (RLlib's model.dim and preprocessing apply) and built with the DeepMind
    wrappers; a module-qualified non-Atari id stays plain."""
    assert is_atari_id("ale_py:ALE/Pong-v5")
    assert not is_atari_id("gymnasium.envs.classic_control:CartPole-v1")
    env = make_env("ale_py:ALE/Pong-v5", {"frame_size": 42})
    try:
        assert env.observation_space.shape == (42, 42, 4)
    finally:
        env.close()
    plain = make_env("gymnasium.envs.classic_control:CartPole-v1")
    assert plain.observation_space.shape == (4,)


@needs_ale
@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_real_games_get_deepmind_frames(env_id):
    env = make_env(env_id)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    assert env.observation_space.shape == (84, 84, 4)
    obs, reward, *_ = env.step(0)
    assert obs.shape == (84, 84, 4) and obs.max() > 0
    chw = make_env(env_id, {"channels_first": True})
    assert chw.reset(seed=0)[0].shape == (4, 84, 84)
    raw = make_env(env_id, {"preprocessing": "none"})
    assert raw.reset(seed=0)[0].shape == (210, 160, 3)


def _step_many(env: gym.Env, actions: np.ndarray, seed: int) -> list[tuple]:
    """Every step's (obs, reward, terminated, truncated, info) over ``actions``, resetting
    at each end."""
    env.reset(seed=seed)
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs.copy(), reward, terminated, truncated, dict(info)))
        if terminated or truncated:
            env.reset()
    return steps


def _slow_skip(env: gym.Env) -> gym.Env:
    """``env`` with its max-pooling wrapper stepping every frame through ``env.step``."""
    layer = env
    while not isinstance(layer, MaxAndSkip):
        layer = layer.env
    assert layer._ale is not None, "the direct ALE path should be on for ale-py games"
    layer._ale = None
    return env


@needs_ale
@pytest.mark.parametrize("env_id,config,ends", [
    ("ALE/Breakout-v5", {}, 5),  # sticky actions, lives, FIRE reset, game overs
    ("PongNoFrameskip-v4", {"frame_size": 42}, 1),
    ("ALE/Breakout-v5", {"grayscale": False, "frame_size": 0, "frame_stack": 1}, 5),
])
def test_max_and_skip_on_the_ale_directly_matches_stepping_every_frame(env_id, config, ends):
    """The direct-ALE frame skip gives the same frames, rewards, ends and info as going
    through ``env.step`` for every frame (the same emulator calls in the same order)."""
    actions = np.random.default_rng(1).integers(0, 4, 1500)
    direct = _step_many(make_env(env_id, config), actions, seed=3)
    stepped = _step_many(_slow_skip(make_env(env_id, config)), actions, seed=3)
    assert sum(terminated for _, _, terminated, _, _ in direct) >= ends
    for (obs, *rest), (obs_slow, *rest_slow) in zip(direct, stepped, strict=True):
        np.testing.assert_array_equal(obs, obs_slow)
        assert rest == rest_slow


@needs_ale
@pytest.mark.parametrize("frames", [28, 29, 30, 31])
def test_max_and_skip_on_the_ale_ends_mid_skip_as_stepping_every_frame(frames):
    """A game cut by the ALE's frame cap inside a skip (each of the 4 frame positions)
    ends at the same step, with the same frame and info, on both paths."""
    def make() -> MaxAndSkip:
        return MaxAndSkip(gym.make("ALE/Pong-v5", frameskip=1, obs_type="grayscale",
                                   max_num_frames_per_episode=frames), 4)

    actions = np.random.default_rng(0).integers(0, 6, 20)
    direct, slow = make(), make()
    slow._ale = None
    assert direct._ale is not None
    steps = _step_many(direct, actions, seed=0)
    assert any(truncated for _, _, _, truncated, _ in steps)
    for (obs, *rest), (obs_slow, *rest_slow) in zip(steps, _step_many(slow, actions, 0),
                                                     strict=True):
        np.testing.assert_array_equal(obs, obs_slow)
        assert rest == rest_slow


@needs_ale
def test_deterministic_ids_skip_four_frames_in_the_ale_without_pooling():
    """gym's retired PongDeterministic-v4 (RLlib's older files): the NoFrameskip game whose
    ALE repeats each action 4 frames, and no max-pooling wrapper on top."""
    assert is_atari_id("PongDeterministic-v4") and not is_atari_id("PongDeterministc-v4")
    env = make_env("PongDeterministic-v4", {"noop_max": 0, "fire_reset": False})
    assert env.observation_space.shape == (84, 84, 4)
    wrappers = []
    layer = env
    while isinstance(layer, gym.Wrapper):
        wrappers.append(type(layer))
        layer = layer.env
    assert MaxAndSkip not in wrappers
    env.reset(seed=0)
    ale = env.unwrapped.ale
    start = ale.getEpisodeFrameNumber()
    for _ in range(10):
        env.step(0)
    assert ale.getEpisodeFrameNumber() - start == 40
    pooled = make_env("PongNoFrameskip-v4", {"noop_max": 0, "fire_reset": False})
    pooled.reset(seed=0)
    start = pooled.unwrapped.ale.getEpisodeFrameNumber()
    pooled.step(0)
    assert pooled.unwrapped.ale.getEpisodeFrameNumber() - start == 4
    with pytest.raises(ValueError, match="drop frame_skip, or use 'PongNoFrameskip-v4'"):
        make_env("PongDeterministic-v4", {"frame_skip": 2})


@needs_ale
def test_breakout_metrics_count_whole_games_in_game_score():
    """Breakout has 5 lives: learning sees 5 episodes, metrics one game with its score."""
    env = VectorEnv([make_env("ALE/Breakout-v5", {"noop_max": 0})], seed=0)
    env.reset()
    rng = np.random.default_rng(0)
    learning_episodes = 0
    clipped_total = 0.0
    for _ in range(5000):
        step = env.step(rng.integers(4, size=1))
        clipped_total += float(step.rewards[0])
        learning_episodes += int(step.terminateds[0] or step.truncateds[0])
        metrics = env.pop_metrics()
        if metrics.num_episodes:
            break
    assert metrics.num_episodes == 1, "a random Breakout game ends within 5000 steps"
    assert learning_episodes == 5
    # Breakout bricks score 1 to 7 points: the game score is >= the clipped sum
    assert metrics.summary()["episode_reward_max"] >= clipped_total >= 0


def test_missing_ale_names_the_extra(monkeypatch):
    import actorrl.envs.atari as atari

    monkeypatch.setattr(atari, "register_ale", lambda: False)
    with pytest.raises(ValueError, match=r"\[atari\]"):
        atari.make_atari("ALE/Pong-v5")
