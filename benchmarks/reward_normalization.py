"""Is reward normalisation why PPO on Hopper-v5 stays below CleanRL's figure?

CleanRL's ``ppo_continuous_action`` learns from rewards scaled by a running estimate of the
discounted return's standard deviation, then clipped to [-10, 10] (gymnasium's
``NormalizeReward`` and ``TransformReward``); ``examples/hopper-ppo.yaml`` learns from the
raw rewards (RLlib has no reward filter). This experiment runs that file both ways, the
same seeds side by side, and reports each run's raw return (what CleanRL reports):

- ``raw``: the example file as it is;
- ``normalized``: its env wrapped as CleanRL wraps it (:func:`make_hopper`), the raw
  reward carried in ``info`` and summed per episode by :class:`RawReturn` into the
  ``raw_return`` custom metric; the value loss clamp and gradient clip CleanRL uses with
  normalised rewards (``vf_clip_param: 0.2`` is CleanRL's ``clip_vloss`` at ``clip_coef``;
  ``grad_clip: 0.5``) are set too, as the file's comment says they were left out only
  because the rewards were raw.

Prints one JSON object (per run: final and best raw return, the return at each 100k env
steps) and writes each run's curve as CSV under ``--out`` (its ``episode_reward_mean``
column holds the raw return in both variants, so ``actorrl plot`` overlays them).

    python benchmarks/reward_normalization.py [--seeds 1,2] [--variants raw,normalized]
                                              [--timesteps 1000000] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from actorrl.callbacks import DefaultCallbacks, Episode  # noqa: E402

CONFIG = REPO / "examples" / "hopper-ppo.yaml"
RAW_REWARD = "raw_reward"
"""The ``info`` key that carries the env's own reward past the normalising wrappers."""


class _KeepRawReward(gym.Wrapper):
    """Copies each step's reward into ``info[RAW_REWARD]`` before later wrappers scale it."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, RAW_REWARD: float(reward)}


def make_hopper(env_config: dict[str, Any]) -> gym.Env:
    """Hopper-v5 with CleanRL's reward wrappers: ``NormalizeReward(gamma)`` then a clip to
    [-10, 10]; the raw reward stays in ``info``."""
    env = _KeepRawReward(gym.make(env_config.get("id", "Hopper-v5")))
    env = gym.wrappers.NormalizeReward(env, gamma=float(env_config.get("gamma", 0.99)))
    return gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10.0, 10.0)))


class RawReturn(DefaultCallbacks):
    """The episode's sum of raw rewards as the ``raw_return`` custom metric."""

    def on_episode_start(self, *, episode: Episode, **kwargs: Any) -> None:
        """Start the sum at 0."""
        episode.user_data[RAW_REWARD] = 0.0

    def on_episode_step(self, *, episode: Episode, **kwargs: Any) -> None:
        """Add the step's raw reward."""
        episode.user_data[RAW_REWARD] += float(episode.last_info_for().get(RAW_REWARD, 0.0))

    def on_episode_end(self, *, episode: Episode, **kwargs: Any) -> None:
        """Report the sum."""
        episode.custom_metrics["raw_return"] = episode.user_data[RAW_REWARD]


def settings(variant: str, seed: int) -> list[str]:
    """``--set`` arguments of one run."""
    common = [f"seed={seed}"]
    if variant == "raw":
        return common
    module = "benchmarks.reward_normalization"
    return [*common, f"env={module}:make_hopper", f"callbacks={module}:RawReturn",
            "vf_clip_param=0.2", "grad_clip=0.5"]


def start(variant: str, seed: int, timesteps: int, folder: Path) -> subprocess.Popen:
    """``actorrl train`` of one run in ``folder`` (its output and results)."""
    args = [sys.executable, "-m", "actorrl.cli", "train", "--config", str(CONFIG),
            "--output", str(folder), "--progress", "plain", "--stop-timesteps", str(timesteps)]
    for item in settings(variant, seed):
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(folder / "train.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def curve(folder: Path, variant: str) -> list[tuple[int, float, float]]:
    """``(env steps, seconds, raw return)`` per result: the mean over the results' window of
    episodes (``metrics_smoothing_episodes``, 100), raw in both variants."""
    (result_file,) = folder.rglob("result.jsonl")
    points = []
    for line in result_file.read_text().splitlines():
        row = json.loads(line)
        value = (row.get("episode_reward_mean") if variant == "raw"
                 else row.get("custom_metrics", {}).get("raw_return_mean"))
        if value is not None and np.isfinite(value):
            points.append((int(row["timesteps_total"]), float(row["time_total_s"]),
                           float(value)))
    return points


def summary(points: list[tuple[int, float, float]]) -> dict[str, Any]:
    """Final (mean of the last 10 results), best, and the value at each 100k env steps."""
    values = [p[2] for p in points]
    marks = {}
    for mark in range(100_000, points[-1][0] + 1, 100_000):
        before = [p[2] for p in points if p[0] <= mark][-5:]
        marks[str(mark)] = round(float(np.mean(before)), 1) if before else None
    return {"final_return": round(float(np.mean(values[-10:])), 1),
            "best_return": round(max(values), 1), "env_steps": points[-1][0],
            "seconds": round(points[-1][1], 1), "returns_at": marks}


def main() -> None:
    """Run the variants x seeds side by side; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--variants", default="raw,normalized")
    parser.add_argument("--timesteps", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [(v, int(s)) for v in args.variants.split(",") for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="reward-norm-") as tmp:
        procs = {}
        for variant, seed in runs:
            folder = Path(tmp, f"{variant}-{seed}")
            folder.mkdir()
            procs[(variant, seed)] = (start(variant, seed, args.timesteps, folder), folder)
        figures = {}
        for (variant, seed), (proc, folder) in procs.items():
            if proc.wait() != 0:
                log = (folder / "train.log").read_text()[-2000:]
                sys.exit(f"{variant} seed {seed} failed: {log}")
            points = curve(folder, variant)
            name = f"ppo-Hopper-v5-{variant}-seed{seed}"
            with open(out / f"{name}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["env_steps", "seconds", "episode_reward_mean"])
                writer.writerows(points)
            figures[name] = summary(points)
    print(json.dumps({"config": str(CONFIG.relative_to(REPO)), "runs_side_by_side": len(runs),
                      "anchor": "CleanRL ppo_continuous_action Hopper-v4 at 1M: 2382.86 +- 271.74",
                      "runs": figures}, indent=1))


if __name__ == "__main__":
    main()
