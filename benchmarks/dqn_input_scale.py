"""Is the Q network's input scale why RLlib's DQN Breakout release test fails here?

RLlib's DQN release test (``dqn-breakoutnoframeskip-v5.yaml``: 20 within 400k env steps,
uniform replay, no double/dueling, Adam lr 6.25e-5) failed here at 5.07. The one part of
its Q network that actorrl builds differently on purpose is the pixels' way in: RLlib's
vision net feeds raw 0-255 pixels into convolutions initialised xavier-uniform (its
``SlimConv2d``/``SlimFC`` default) with zero biases, so its features and first Q-values are
large (on Breakout frames its 256 features have a norm of 76-99 and its Q-values a mean
size of 1.4-5.3, over three initialisations); actorrl's
:class:`~actorrl.policy.encoders.ConvEncoder` scales uint8 frames to [0, 1] and starts
orthogonal with relu gain (norm 2.8-5.5, Q-values 0.06-0.19). Adam moves every weight by
about the learning rate whatever the gradient's size, so a head over features ~20x larger
moves its Q-values ~20x more per step: RLlib's lr is, in effect, a larger one. This
experiment runs the file both ways, everything else equal:

- ``actorrl``: the file with actorrl's scaled encoder (``model.vision_net: actorrl``; since
  this experiment, RLlib's DQN files default to RLlib's vision net);
- ``rllib_net``: ``model.vision_net: rllib``, the Q network RLlib 2.7.2 builds for the file
  (the same conv stack, 256 features, a 512-unit relu layer, the Q-values), weights
  xavier-uniform, biases zero, raw 0-255 inputs. (The published run set the same network
  as a custom model written in this file, before the option existed.)

Prints one JSON object (per run: the reward at each 50k env steps, the best, where the bar
was first reached) and writes each run's curve as CSV under ``--out``.

    python benchmarks/dqn_input_scale.py RELEASE_FILE [--variants actorrl,rllib_net]
                                         [--timesteps 400000] [--seed N] [--out DIR]
                                         [--work DIR]
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

import yaml

REPO = Path(__file__).resolve().parent.parent

VISION_NETS = {"actorrl": "actorrl", "rllib_net": "rllib"}
"""Each variant's ``model.vision_net``."""
VARIANTS = tuple(VISION_NETS)


def release_experiment(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's first experiment: its name and its data."""
    data = yaml.safe_load(path.read_text())
    name, experiment = next(iter(data.items()))
    return name, experiment


def run_file(experiment: dict[str, Any], variant: str) -> dict[str, Any]:
    """The experiment as run here: no ``pass_criteria`` or ``stop`` (the run's length is
    ``--timesteps``), and the variant's ``model.vision_net`` named (RLlib's DQN files
    default to ``rllib`` now, so the ``actorrl`` variant must say so)."""
    data = {k: v for k, v in experiment.items() if k not in ("pass_criteria", "stop")}
    config = dict(data.get("config") or {})
    config["model"] = {**(config.get("model") or {}), "vision_net": VISION_NETS[variant]}
    data["config"] = config
    return data


def start(name: str, data: dict[str, Any], timesteps: int, seed: int | None, folder: Path
          ) -> subprocess.Popen:
    """``actorrl train`` of one run in ``folder`` (its file, output and log)."""
    config = folder / "experiment.yaml"
    config.write_text(yaml.safe_dump({name: data}, sort_keys=False))
    args = [sys.executable, "-m", "actorrl.cli", "train", "--config", str(config),
            "--output", str(folder), "--progress", "plain", "--stop-reward", "none",
            "--stop-time", "none", "--stop-timesteps", str(timesteps)]
    if seed is not None:
        args += ["--seed", str(seed)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(folder / "train.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def curve(folder: Path) -> list[tuple[int, float, float]]:
    """``(env steps, seconds, episode_reward_mean)`` per result with a reward."""
    points = []
    for result_file in sorted(folder.rglob("result.jsonl")):
        for line in result_file.read_text().splitlines():
            row = json.loads(line)
            value = row.get("episode_reward_mean")
            if isinstance(value, (int, float)) and value == value:
                points.append((int(row["timesteps_total"]), float(row["time_total_s"]),
                               float(value)))
    return points


def summary(points: list[tuple[int, float, float]], bar: float, every: int = 50_000
            ) -> dict[str, Any]:
    """The reward at each ``every`` env steps (the first result at or after it), the best
    and where, the last, and where ``bar`` was first reached (None: not reached)."""
    if not points:
        return {"results": 0}
    marks: dict[str, float] = {}
    for mark in range(every, points[-1][0] + 1, every):
        after = next(p for p in points if p[0] >= mark)
        marks[f"{mark // 1000}k"] = round(after[2], 2)
    best = max(points, key=lambda p: p[2])
    reached = next((p for p in points if p[2] >= bar), None)
    return {"env_steps": points[-1][0], "training_s": round(points[-1][1], 1),
            "last": round(points[-1][2], 2), "best": round(best[2], 2),
            "best_at_env_steps": best[0], "at": marks,
            "bar_reached_at_env_steps": reached[0] if reached else None}


def write_csv(points: list[tuple[int, float, float]], path: Path) -> None:
    """The curve in ``actorrl plot``'s columns."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["env_steps", "seconds", "episode_reward_mean"])
        writer.writerows(points)


def main(argv: list[str] | None = None) -> None:
    """Run the variants side by side to ``--timesteps``; print and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="RLlib's dqn-breakoutnoframeskip-v5.yaml")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--timesteps", type=int, default=None,
                        help="env steps per run (default: the file's pass_criteria budget)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="where the CSVs and JSON go")
    parser.add_argument("--work", type=Path, default=None,
                        help="the runs' folders (default: a new temporary folder)")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    name, experiment = release_experiment(args.file)
    criteria = experiment.get("pass_criteria") or {}
    bar = float(criteria.get("sampler_results/episode_reward_mean",
                             criteria.get("episode_reward_mean", 20.0)))
    timesteps = args.timesteps or int(criteria.get("timesteps_total", 400_000))
    work = args.work or Path(tempfile.mkdtemp(prefix="dqn-input-scale-"))
    runs = {}
    for variant in variants:
        folder = work / variant
        folder.mkdir(parents=True)
        runs[variant] = (folder, start(name, run_file(experiment, variant), timesteps,
                                       args.seed, folder))
    results: dict[str, Any] = {"file": str(args.file), "bar": bar, "timesteps": timesteps,
                               "seed": args.seed, "work": str(work), "runs": {}}
    for variant, (folder, proc) in runs.items():
        code = proc.wait()
        points = curve(folder)
        results["runs"][variant] = {"exit_code": code, **summary(points, bar)}
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            write_csv(points, args.out / f"dqn-breakout-{variant}.csv")
    if args.out is not None:
        (args.out / "dqn-breakout-input-scale.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
