"""benchmarks/reward_normalization.py: CleanRL's reward wrappers keep the raw reward, the
callback reports the raw return, and a short ``actorrl train`` with both reports it."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from actorrl.callbacks import Episode
from tests.helpers.benchmark_scripts import load_benchmark, unload_benchmark
from tests.helpers.extras import installed

needs_mujoco = pytest.mark.skipif(not installed("mujoco"),
                                  reason="the mujoco extra is not installed")


@pytest.fixture(scope="module")
def bench():
    module = load_benchmark("reward_normalization")
    yield module
    unload_benchmark(module)


@needs_mujoco
def test_wrapped_hopper_learns_from_scaled_rewards_and_keeps_the_raw_ones(bench) -> None:
    """The same seed and actions: ``info`` carries the plain env's reward, the reward the
    learner sees is scaled (not equal to it) and within [-10, 10]."""
    wrapped, plain = bench.make_hopper({}), gym.make("Hopper-v5")
    wrapped.reset(seed=3)
    plain.reset(seed=3)
    rng = np.random.default_rng(0)
    scaled, raw = [], []
    for _ in range(50):
        action = rng.uniform(-1, 1, 3).astype(np.float32)
        _, reward, term, trunc, info = wrapped.step(action)
        _, plain_reward, *_ = plain.step(action)
        assert info[bench.RAW_REWARD] == pytest.approx(plain_reward)
        scaled.append(reward)
        raw.append(plain_reward)
        if term or trunc:
            break
    assert np.all(np.abs(scaled) <= 10.0)
    assert not np.allclose(scaled, raw)


def test_raw_return_sums_the_raw_rewards_not_the_learning_ones(bench) -> None:
    callbacks = bench.RawReturn()
    episode = Episode(0, 0)
    callbacks.on_episode_start(episode=episode)
    for scaled, raw in [(0.5, 3.0), (-0.25, 2.5), (1.0, -1.0)]:
        episode.step(scaled, {bench.RAW_REWARD: raw}, None)
        callbacks.on_episode_step(episode=episode)
    callbacks.on_episode_end(episode=episode)
    assert episode.custom_metrics["raw_return"] == pytest.approx(4.5)
    assert episode.total_reward == pytest.approx(1.25)


def test_summary_reads_final_best_and_marks(bench) -> None:
    points = [(50_000 * i, float(i), 10.0 * i) for i in range(1, 21)]
    out = bench.summary(points)
    assert out["env_steps"] == 1_000_000 and out["best_return"] == 200.0
    assert out["final_return"] == pytest.approx(np.mean([10.0 * i for i in range(11, 21)]))
    assert out["returns_at"]["100000"] == pytest.approx(15.0)  # the 50k and 100k results


def test_only_the_normalized_variant_changes_the_env_and_the_loss(bench) -> None:
    assert bench.settings("raw", 2) == ["seed=2"]
    normalized = bench.settings("normalized", 2)
    assert "env=benchmarks.reward_normalization:make_hopper" in normalized
    assert {"vf_clip_param=0.2", "grad_clip=0.5"} <= set(normalized)


@needs_mujoco
def test_a_short_normalized_run_reports_the_raw_return(bench, tmp_path: Path) -> None:
    """``actorrl train`` with the wrapped env and the callback: results carry
    ``raw_return_mean``, and it is not the (scaled) ``episode_reward_mean``."""
    proc = bench.start("normalized", 1, 6144, tmp_path)
    assert proc.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-2000:]
    (result_file,) = tmp_path.rglob("result.jsonl")
    last = json.loads(result_file.read_text().splitlines()[-1])
    raw = last["custom_metrics"]["raw_return_mean"]
    assert np.isfinite(raw) and raw != pytest.approx(last["episode_reward_mean"])
    assert bench.curve(tmp_path, "normalized")[-1][2] == pytest.approx(raw)
