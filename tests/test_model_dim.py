"""RLlib's Atari preprocessor model keys (``model.dim``, ``grayscale``, ``zero_mean``,
``framestack``) and the top-level ``preprocessor_pref``: what the workers' envs and models
become, built through the rollout worker's own code path; all bounded by steps."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorrl.algorithms import get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.envs import atari
from actorrl.envs.atari import model_env_config
from actorrl.policy.encoders import ConvEncoder, build_encoder
from actorrl.policy.model_config import MODEL_DEFAULTS, MODEL_KEY_DOCS
from actorrl.rollout import RolloutWorker
from tests.helpers.extras import installed
from transport.codec import encode

pytestmark = pytest.mark.unit

needs_ale = pytest.mark.skipif(not installed("ale_py"),
                               reason="the atari extra (ale-py) is not installed")

PONG = "PongNoFrameskip-v4"
RLLIB_84 = [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]
RLLIB_42 = [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]]
SMALL = {"num_envs_per_worker": 1, "rollout_fragment_length": 20}


def config_of(algo: str, **values):
    """``algo``'s config from flat RLlib keys, as ``actorrl train --config`` loads them."""
    return load_config(get_algorithm(algo).config_cls, values)


def worker_of(algo: str, config, settings=None) -> RolloutWorker:
    """A remote-style rollout worker (index 1) built as the trainer builds one."""
    return RolloutWorker(config.env, get_algorithm(algo).policy,
                         config.worker_config() if settings is None else settings,
                         worker_index=1, num_workers=1, seed=0)


def conv_stack(encoder: ConvEncoder) -> list[list]:
    """``[[out_channels, [kh, kw], stride], ...]`` of the encoder's conv layers."""
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    return [[c.out_channels, list(c.kernel_size), c.stride[0]] for c in convs]


def encoders(policy) -> list[ConvEncoder]:
    return [m for m in policy.model.modules() if isinstance(m, ConvEncoder)]


@needs_ale
@pytest.mark.parametrize("algo", ["impala", "apex"])
def test_dim_42_gives_workers_42x42_frames_and_rllibs_42x42_conv_stack(algo):
    config = config_of(algo, env=PONG, model={"dim": 42}, **SMALL)
    assert config.env_config == {"frame_size": 42}
    worker = worker_of(algo, config)
    try:
        space = worker.env.observation_space
        assert space.shape == (42, 42, 4) and space.dtype == np.uint8
        policy = worker.get_policy()
        found = encoders(policy)
        assert found
        for encoder in found:
            assert conv_stack(encoder) == RLLIB_42
            assert encoder.out_dim == 256
            assert encoder.scale == pytest.approx(1 / 255) and encoder.shift == 0.0
        batch = worker.sample()
        obs = batch["obs"]
        assert obs.dtype == np.uint8 and obs.shape == (20, 42, 42, 4)
        # frame stacks still travel each distinct frame once
        raw = obs.nbytes + batch["new_obs"].nbytes
        assert sum(memoryview(f).nbytes for f in encode(batch)) < raw / 3
    finally:
        worker.stop()


@needs_ale
def test_default_atari_path_is_unchanged():
    config = config_of("impala", env=PONG, **SMALL)
    assert config.env_config == {}
    worker = worker_of("impala", config)
    try:
        assert worker.env.observation_space.shape == (84, 84, 4)
        assert worker.env.observation_space.dtype == np.uint8
        for encoder in encoders(worker.get_policy()):
            assert conv_stack(encoder) == RLLIB_84
            assert encoder.out_dim == 256
            assert encoder.scale == pytest.approx(1 / 255) and encoder.shift == 0.0
    finally:
        worker.stop()
    # dim 84 and framestack true written out are the defaults: env_config stays untouched
    same = config_of("impala", env=PONG, model={"dim": 84, "framestack": True,
                                                "grayscale": True})
    assert same.env_config == {}


def test_no_model_keys_checks_nothing(monkeypatch):
    """Without dim/grayscale/framestack the fold neither looks the env up nor copies."""
    def boom(spec):
        raise AssertionError("is_atari_id called")

    monkeypatch.setattr(atari, "is_atari_id", boom)
    assert model_env_config(PONG, {"frame_size": 42}, {"fcnet_hiddens": [8]}) == \
        ({"frame_size": 42}, [])
    assert model_env_config(PONG, None, None) == ({}, [])


@needs_ale
def test_dim_and_a_disagreeing_frame_size_are_refused_naming_both():
    with pytest.raises(ConfigError) as info:
        config_of("impala", env=PONG, model={"dim": 42}, env_config={"frame_size": 84})
    message = str(info.value)
    assert "model.dim=42" in message and "env_config.frame_size=84" in message
    assert "set only one" in message
    # agreeing values are fine
    assert config_of("impala", env=PONG, model={"dim": 42},
                     env_config={"frame_size": 42}).env_config == {"frame_size": 42}


@needs_ale
def test_dim_on_a_non_atari_env_is_refused_unless_it_is_the_no_op_84():
    with pytest.raises(ConfigError, match=r"model\.dim=42 .*'CartPole-v1' is not one"):
        config_of("impala", env="CartPole-v1", model={"dim": 42})
    # RLlib's defaults written out (a dumped RLlib config) are accepted and change nothing
    config = config_of("impala", env="CartPole-v1", model={
        "dim": 84, "grayscale": False, "zero_mean": True, "framestack": True})
    assert config.env_config == {}
    with pytest.raises(ConfigError, match=r"model\.dim.*integer >= 1"):
        config_of("impala", env=PONG, model={"dim": 0})
    with pytest.raises(ConfigError, match=r"model\.framestack.*true or false"):
        config_of("impala", env=PONG, model={"framestack": 4})


@needs_ale
def test_framestack_false_gives_one_channel_and_refuses_a_stack_in_env_config():
    config = config_of("impala", env=PONG, model={"framestack": False}, **SMALL)
    assert config.env_config == {"frame_stack": 1}
    worker = worker_of("impala", config)
    try:
        assert worker.env.observation_space.shape == (84, 84, 1)
        for encoder in encoders(worker.get_policy()):
            first = next(m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d))
            assert first.in_channels == 1
        assert worker.sample()["obs"].shape == (20, 84, 84, 1)
    finally:
        worker.stop()
    with pytest.raises(ConfigError, match=r"model\.framestack=False .*env_config\.frame_stack=4"):
        config_of("impala", env=PONG, model={"framestack": False},
                  env_config={"frame_stack": 4})


@needs_ale
def test_grayscale_false_gives_rgb_frames_stacked_channel_after_channel():
    config = config_of("impala", env=PONG, model={"grayscale": False, "dim": 42}, **SMALL)
    assert config.env_config == {"frame_size": 42, "grayscale": False}
    worker = worker_of("impala", config)
    try:
        assert worker.env.observation_space.shape == (42, 42, 12)
        obs = worker.sample()["obs"]
        assert obs.shape == (20, 42, 42, 12) and obs.dtype == np.uint8
        assert not np.array_equal(obs[..., 0], obs[..., 2])  # R and B differ on Pong
    finally:
        worker.stop()


def test_zero_mean_scales_uint8_frames_to_minus_one_one():
    space = gym.spaces.Box(0, 255, (42, 42, 4), np.uint8)
    seen: dict[str, torch.Tensor] = {}

    def first_input(zero_mean: bool, frame: np.ndarray) -> torch.Tensor:
        encoder, size = build_encoder(space, {"zero_mean": zero_mean})
        assert size == 256 and conv_stack(encoder) == RLLIB_42
        first = next(m for m in encoder.modules()
                     if isinstance(m, (torch.nn.Conv2d, torch.nn.ZeroPad2d)))
        handle = first.register_forward_pre_hook(
            lambda module, args: seen.__setitem__("x", args[0].clone()))
        with torch.no_grad():
            encoder(torch.from_numpy(frame[None]))
        handle.remove()
        return seen["x"]

    frame = np.zeros((42, 42, 4), np.uint8)
    frame[:21] = 255
    for zero_mean, low in ((False, 0.0), (True, -1.0)):
        x = first_input(zero_mean, frame)
        assert x.min().item() == pytest.approx(low) and x.max().item() == pytest.approx(1.0)
    # x / 127.5 - 1: 51 -> -0.6
    x = first_input(True, np.full((42, 42, 4), 51, np.uint8))
    assert torch.allclose(x, torch.full_like(x, 51 / 127.5 - 1))
    # float images are never scaled
    float_space = gym.spaces.Box(0.0, 1.0, (42, 42, 4), np.float32)
    encoder, _ = build_encoder(float_space, {"zero_mean": True})
    assert encoder.scale == 1.0 and encoder.shift == 0.0


@needs_ale
def test_the_fold_survives_round_trips_and_reaches_evaluation_workers():
    config = config_of("impala", env=PONG, model={"dim": 42}, evaluation_interval=1)
    again = load_config(type(config), config.to_dict())
    assert again.env_config == {"frame_size": 42}
    assert again.evaluation_worker_config().rollout.env_config == {"frame_size": 42}
    assert config.worker_config().rollout.env_config == {"frame_size": 42}


@needs_ale
def test_preprocessor_pref():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_of("impala", env=PONG).preprocessor_pref == "deepmind"
        config_of("impala", env=PONG, preprocessor_pref="deepmind")
        config_of("impala", env="CartPole-v1", preprocessor_pref="rllib")  # not Atari
        config_of("impala", env="CartPole-v1", preprocessor_pref=None)
    for pref in ("rllib", None):
        with pytest.warns(UserWarning, match="always uses DeepMind preprocessing"):
            config = config_of("impala", env=PONG, preprocessor_pref=pref)
        assert config.env_config == {}
    with pytest.raises(ConfigError, match="preprocessor_pref must be 'deepmind', 'rllib'"):
        config_of("impala", env=PONG, preprocessor_pref="generic")


def test_every_model_key_has_a_reference_line():
    from actorrl.config.reference import model_reference

    assert set(MODEL_KEY_DOCS) == set(MODEL_DEFAULTS)
    table = "\n".join(model_reference())
    for key in ("dim", "grayscale", "zero_mean", "framestack"):
        assert f"| `model.{key}` |" in table


@needs_ale
def test_atari_benchmark_settings_build_workers_with_dim():
    """benchmarks/atari.py's config path (its --quick settings, the mapping its ceiling
    phase hands RolloutWorker) with ``--set model=...``: one sample, no pipeline run."""
    bench = pytest.importorskip("benchmarks.atari")
    for overrides, shape in (([], (84, 84, 4)), (['model={"dim": 42}'], (42, 42, 4))):
        spec, config = bench.load_settings("impala", None, None,
                                           [*overrides, "num_envs_per_worker=1",
                                            "rollout_fragment_length=10"], True)
        worker = RolloutWorker(config.env, spec.policy, config.to_dict(), worker_index=1,
                               num_workers=bench.NUM_WORKERS, seed=0)
        try:
            batch = worker.sample()
            assert batch["obs"].shape == (10, *shape)
            assert 0 < bench.wire_nbytes(batch) < batch["obs"].nbytes
        finally:
            worker.stop()
