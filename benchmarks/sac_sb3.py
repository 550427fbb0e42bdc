"""SAC's env steps per second against Stable-Baselines3's at the same replay ratio.

Prints one JSON object. Both trainings run SAC on HalfCheetah-v5 with Stable-Baselines3's
defaults (one 256-row update per env step, uniform replay of 1M rows, 1-step targets,
[256, 256] ReLU actor and twin critics, Adam at 3e-4, tau 0.005 after every update, a
learned temperature from 1.0 toward ``-action_dim``), random actions for the first
``--learning-starts`` env steps, then ``--steps`` env steps that each train once; each is
timed over those learning steps only:

- ``sb3``: ``stable_baselines3.SAC("MlpPolicy", ...).learn()`` in a subprocess with torch on
  one thread (as SB3's user runs it: one process, sampling and learning in turn);
- ``actorrl``: ``actorrl train --config FILE`` as a user runs it (a rollout worker process
  sampling beside the learner process, ``training_intensity`` 256 rows per env step
  honoured exactly), its rate read from ``result.jsonl``.

``ratio`` = actorrl / sb3 env steps per second; the two run one after the other in this
invocation (``--rounds`` > 1 alternates them and reports medians), so the machine's speed of
the day hits both. Needs the mujoco extra and ``pip install stable-baselines3`` (a
benchmark-only reference, not a dependency of actorrl).

``--learner-cpus 1,2`` also measures actorrl with its learner on two torch threads
(``num_cpus_for_driver: 2``: the sampler and the learner then share the second core).

    python benchmarks/sac_sb3.py [--steps 10000] [--learning-starts 2000] [--rounds 1]
                                 [--learner-cpus 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENV = "HalfCheetah-v5"

SB3_SCRIPT = f"""
import json, sys, time
import torch
torch.set_num_threads(1)
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
starts, steps, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

class Clock(BaseCallback):
    start = None
    def _on_step(self):
        if self.start is None and self.num_timesteps >= starts:
            self.start = (time.perf_counter(), self.num_timesteps)
        return True

clock = Clock()
model = SAC("MlpPolicy", "{ENV}", learning_starts=starts, seed=seed, device="cpu")
model.learn(total_timesteps=starts + steps, callback=clock)
end = time.perf_counter()
returns = [e["r"] for e in model.ep_info_buffer]
print(json.dumps({{"env_steps": model.num_timesteps - clock.start[1],
                  "seconds": end - clock.start[0], "updates": model._n_updates,
                  "last_returns_mean": sum(returns[-5:]) / max(1, len(returns[-5:]))}}))
"""

ACTORRL_CONFIG = """\
sac-sb3-settings:
  env: {env}
  run: SAC
  stop:
    timesteps_total: {total}
  config:
    seed: {seed}
    num_workers: 0
    num_cpus_for_driver: {learner_cpus}
    gamma: 0.99
    tau: 0.005
    n_step: 1
    initial_alpha: 1.0
    target_entropy: auto
    train_batch_size: 256
    rollout_fragment_length: 1
    training_intensity: 256
    target_network_update_freq: 0
    min_sample_timesteps_per_iteration: 1000
    num_steps_sampled_before_learning_starts: {starts}
    replay_buffer_config:
      type: MultiAgentReplayBuffer
      capacity: 1000000
    q_model_config:
      fcnet_hiddens: [256, 256]
      fcnet_activation: relu
    policy_model_config:
      fcnet_hiddens: [256, 256]
      fcnet_activation: relu
    optimization:
      actor_learning_rate: 0.0003
      critic_learning_rate: 0.0003
      entropy_learning_rate: 0.0003
"""


def run_sb3(starts: int, steps: int, seed: int) -> dict[str, Any]:
    """Stable-Baselines3's SAC in a subprocess; its env steps per second while learning."""
    out = subprocess.run([sys.executable, "-c", SB3_SCRIPT, str(starts), str(steps), str(seed)],
                         capture_output=True, text=True, check=True, timeout=3600)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["env_steps_per_s"] = figures["env_steps"] / figures["seconds"]
    return figures


def run_actorrl(starts: int, steps: int, seed: int, learner_cpus: int = 1) -> dict[str, Any]:
    """``actorrl train`` with SB3's settings and ``learner_cpus`` torch threads in the
    learner (``num_cpus_for_driver``); its env steps per second once learning runs
    (between the first result past ``starts`` and the last)."""
    with tempfile.TemporaryDirectory(prefix="sac-sb3-") as tmp:
        config = Path(tmp, "sac.yaml")
        config.write_text(ACTORRL_CONFIG.format(env=ENV, total=starts + steps, seed=seed,
                                                starts=starts, learner_cpus=learner_cpus))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "actorrl.cli", "train", "--config", str(config),
                        "--output", tmp, "--progress", "plain"], cwd=tmp, env=env,
                       capture_output=True, text=True, check=True, timeout=3600)
        (result_file,) = Path(tmp).rglob("result.jsonl")
        rows = [json.loads(line) for line in result_file.read_text().splitlines()]
    learning = [r for r in rows if r["timesteps_total"] > starts + 1000]
    first, last = learning[0], learning[-1]
    env_steps = last["timesteps_total"] - first["timesteps_total"]
    seconds = last["time_total_s"] - first["time_total_s"]
    trained = last["num_steps_trained"] - first["num_steps_trained"]
    return {"env_steps": env_steps, "seconds": seconds, "updates": trained // 256,
            "env_steps_per_s": env_steps / seconds,
            "rows_trained_per_env_step": trained / env_steps,
            "last_returns_mean": last["episode_reward_mean"]}


def main() -> None:
    """Run both, ``--rounds`` times alternately, and print the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="learning env steps timed")
    parser.add_argument("--learning-starts", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learner-cpus", default="1",
                        help="comma-separated torch thread counts of actorrl's learner to "
                             "measure (num_cpus_for_driver), e.g. 1,2")
    args = parser.parse_args()
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        sys.exit("this benchmark compares with Stable-Baselines3: pip install "
                 "stable-baselines3 (a reference only; actorrl does not need it)")
    learner_cpus = [int(c) for c in args.learner_cpus.split(",")]
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        load_before = os.getloadavg()[0]
        sb3 = run_sb3(args.learning_starts, args.steps, args.seed)
        ours = {cpus: run_actorrl(args.learning_starts, args.steps, args.seed, cpus)
                for cpus in learner_cpus}
        rounds.append({"sb3": sb3, "load_average_before": load_before,
                       **{actorrl_key(c): run for c, run in ours.items()},
                       **{ratio_key(c): run["env_steps_per_s"] / sb3["env_steps_per_s"]
                          for c, run in ours.items()}})
    import stable_baselines3
    import torch
    print(json.dumps({
        "env": ENV, "learning_starts": args.learning_starts, "steps": args.steps,
        "sb3_version": stable_baselines3.__version__, "torch": torch.__version__,
        "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M"),
        "sb3_env_steps_per_s": statistics.median(r["sb3"]["env_steps_per_s"] for r in rounds),
        **{f"{actorrl_key(c)}_env_steps_per_s": statistics.median(
            r[actorrl_key(c)]["env_steps_per_s"] for r in rounds) for c in learner_cpus},
        **{ratio_key(c): statistics.median(r[ratio_key(c)] for r in rounds)
           for c in learner_cpus},
        "rounds": rounds}, indent=2))


def actorrl_key(learner_cpus: int) -> str:
    """``actorrl`` (one learner thread, the default) or ``actorrl_learner_N_threads``."""
    return "actorrl" if learner_cpus == 1 else f"actorrl_learner_{learner_cpus}_threads"


def ratio_key(learner_cpus: int) -> str:
    """``ratio`` (one learner thread) or ``ratio_learner_N_threads``: actorrl / SB3."""
    return "ratio" if learner_cpus == 1 else f"ratio_learner_{learner_cpus}_threads"


if __name__ == "__main__":
    main()
