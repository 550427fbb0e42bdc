"""``model.vision_net: rllib`` and benchmarks/dqn_input_scale.py: the option builds RLlib's
DQN Q network (shapes, raw pixels, xavier init), the benchmark's variants name their
vision net, and a short run of both variants trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from torch import nn

from actorrl.policy.config import DQNPolicyConfig
from actorrl.policy.dqn import build_q_network
from actorrl.policy.model_config import resolve_model_config
from tests.helpers.benchmark_scripts import load_benchmark, unload_benchmark
from tests.helpers.extras import installed

needs_atari = pytest.mark.skipif(not installed("ale_py"),
                                 reason="the atari extra is not installed")

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


@pytest.fixture(scope="module")
def bench():
    module = load_benchmark("dqn_input_scale")
    yield module
    unload_benchmark(module)


def q_network(vision_net: str = "rllib", hiddens: tuple[int, ...] = (512,)) -> nn.Module:
    """The DQN Q network over 84x84x4 frames and 4 actions with ``vision_net``."""
    torch.manual_seed(0)
    config = DQNPolicyConfig(hiddens=hiddens, dueling=False, model={"vision_net": vision_net})
    return build_q_network(FRAMES, 4, config)


def test_the_q_network_has_rllibs_layer_shapes() -> None:
    """RLlib 2.7.2's DQN model for 84x84x4 frames and 4 actions, less its unused value
    branch: conv 16x8x8/4, 32x4x4/2, 256x11x11, then 256 -> 512 -> 4."""
    net = q_network()
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(16, 4, 8, 8), (16,), (32, 16, 4, 4), (32,), (256, 32, 11, 11), (256,),
                      (512, 256), (512,), (4, 512), (4,)]
    assert sum(p.numel() for p in net.parameters()) == 1_137_460
    assert net(torch.zeros(3, 84, 84, 4, dtype=torch.uint8)).shape == (3, 4)


def raw_features(encoder: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """The encoder's layers applied to the frames' 0-255 values as they are."""
    return encoder.layers(frames.permute(0, 3, 1, 2).float())


def test_pixels_go_in_unscaled_and_actorrls_default_scales_them() -> None:
    """uint8 frames enter as their 0-255 values (a network that scaled them to [0, 1]
    would give other, ~255x smaller features); actorrl's default scales them."""
    frames = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (2, 84, 84, 4),
                                                                dtype=np.uint8))
    net, default = q_network().trunk, q_network("actorrl").trunk
    with torch.no_grad():
        features = net(frames)
        torch.testing.assert_close(features, raw_features(net, frames))
        assert not torch.allclose(default(frames), raw_features(default, frames))
        torch.testing.assert_close(default(frames), default.layers(
            frames.permute(0, 3, 1, 2).float() / 255.0))
    assert features.std() > 1.0


def test_every_layer_is_xavier_uniform_with_zero_bias() -> None:
    for layer in q_network(hiddens=(64, 32)).modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            fan_out = layer.weight.shape[0] * layer.weight[0, 0].numel()
            fan_in = layer.weight[0].numel()
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            assert layer.weight.abs().max() <= bound
            assert layer.weight.abs().max() > 0.9 * bound  # uniform up to the bound
            assert torch.count_nonzero(layer.bias) == 0


def test_each_variant_names_its_vision_net(bench) -> None:
    experiment = {"env": "ALE/Breakout-v5", "run": "DQN",
                  "pass_criteria": {"episode_reward_mean": 20.0},
                  "stop": {"time_total_s": 7200},
                  "config": {"hiddens": [512], "lr": 6.25e-5, "model": {"dim": 84}}}
    plain = bench.run_file(experiment, "actorrl")
    assert "pass_criteria" not in plain and "stop" not in plain
    assert plain["config"] == {**experiment["config"],
                               "model": {"dim": 84, "vision_net": "actorrl"}}
    rllib = bench.run_file(experiment, "rllib_net")
    assert rllib["config"]["model"] == {"dim": 84, "vision_net": "rllib"}
    assert experiment["config"]["model"] == {"dim": 84}  # the input is left as it was


def test_summary_marks_the_bar_and_the_curve(bench) -> None:
    points = [(25_000 * i, 10.0 * i, float(i)) for i in range(1, 17)]
    out = bench.summary(points, bar=10.0)
    assert out["bar_reached_at_env_steps"] == 250_000
    assert out["at"]["100k"] == 4.0 and out["at"]["400k"] == 16.0
    assert out["best"] == 16.0 and out["best_at_env_steps"] == 400_000
    assert bench.summary(points, bar=99.0)["bar_reached_at_env_steps"] is None


@needs_atari
def test_a_short_run_of_both_variants_trains(bench, tmp_path: Path, capsys) -> None:
    """Both variants of a small file in the release test's layout train past learning
    starts, each with its vision net."""
    release = tmp_path / "dqn-breakout.yaml"
    release.write_text(yaml.safe_dump({"dqn-breakout-small": {
        "env": "ALE/Breakout-v5", "run": "DQN",
        "pass_criteria": {"sampler_results/episode_reward_mean": 20.0,
                          "timesteps_total": 800},
        "stop": {"time_total_s": 7200},
        "config": {"env_config": {"frameskip": 1, "repeat_action_probability": 0.0},
                   "double_q": False, "dueling": False, "hiddens": [512],
                   "replay_buffer_config": {"type": "MultiAgentReplayBuffer",
                                            "capacity": 2000},
                   "num_steps_sampled_before_learning_starts": 200,
                   "rollout_fragment_length": 4, "train_batch_size": 32,
                   "min_sample_timesteps_per_iteration": 200, "num_gpus": 0}}}))
    out = tmp_path / "out"
    bench.main([str(release), "--out", str(out), "--work", str(tmp_path / "runs")])
    summary = json.loads(capsys.readouterr().out)
    assert summary["timesteps"] == 800 and summary["bar"] == 20.0
    for variant in bench.VARIANTS:
        run = summary["runs"][variant]
        assert run["exit_code"] == 0 and run["env_steps"] >= 800, run
        assert (out / f"dqn-breakout-{variant}.csv").read_text().count("\n") >= 2
    work = Path(summary["work"])
    models = {variant: json.loads(next((work / variant).rglob("config.json")).read_text())
              for variant in bench.VARIANTS}
    assert {variant: json.dumps(models[variant]).count('"vision_net": "rllib"')
            for variant in bench.VARIANTS} == {"actorrl": 0, "rllib_net": 1}
    assert (work / "rllib_net" / "train.log").read_text().count("num_steps_trained=") >= 1


def test_an_unknown_vision_net_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="vision_net.*'actorrl', 'rllib'.*'tf'"):
        resolve_model_config({"vision_net": "tf"})
    with pytest.raises(ValueError, match="zero_mean.*raw"):
        resolve_model_config({"vision_net": "rllib", "zero_mean": True})
