"""RLlib's own algorithm on one of RLlib's tuned example files, for the cases where actorrl
misses a file's bar and the question is whether RLlib reaches it; prints one line per
result and, at the end, ONE JSON object.

Runs in a separate virtual environment with Ray (never actorrl's: Ray is what actorrl's
users left), e.g. RLlib 2.7.2, whose API this script uses::

    python -m venv /tmp/rayvenv
    /tmp/rayvenv/bin/pip install torch==2.13.0
    /tmp/rayvenv/bin/pip install "ray[rllib]==2.7.2" "numpy<2" "pandas<2.2" "pyarrow<15" \\
        "setuptools<70"
    /tmp/rayvenv/bin/python benchmarks/rllib_reference.py FILE.yaml [--set KEY=JSON ...]

The file runs as RLlib would run it, with ``framework: torch`` and ``num_gpus: 0`` (RLlib
2.7's IMPALA asks for a GPU by default) unless the file sets them, on as many CPUs as the
file's workers need (``ray.init(num_cpus=...)``; a 2-core machine oversubscribes), until
the file's ``stop`` reward or its env-step budget (a release learning test's
``pass_criteria`` where its ``stop`` names neither). Results measured with it:
``docs/results/rllib-impala-pendulum.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml


def main() -> None:
    """Train the file's (first) experiment with RLlib; print the curve as JSON."""
    import ray
    from ray.tune.registry import get_trainable_cls

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    (name, experiment), *_ = yaml.safe_load(args.file.read_text()).items()
    config: dict[str, Any] = dict(experiment.get("config") or {})
    config.setdefault("framework", "torch")
    config.setdefault("num_gpus", 0)
    config["env"] = experiment.get("env", config.get("env"))
    for text in args.set:
        key, _, value = text.partition("=")
        config[key] = json.loads(value)
    stop = {k.rsplit("/", 1)[-1]: v for k, v in (experiment.get("stop") or {}).items()}
    # A release learning test's bar is its pass_criteria (its stop is a time limit).
    criteria = {k.rsplit("/", 1)[-1]: v
                for k, v in (experiment.get("pass_criteria") or {}).items()}
    target = stop.get("episode_reward_mean", criteria.get("episode_reward_mean"))
    budget = stop.get("timesteps_total", criteria.get("timesteps_total"))
    if str(config["env"]).startswith("ALE/"):
        # gymnasium 0.28 (RLlib 2.7's) finds the ALE/ ids only once ale_py is imported
        # (pip install ale-py==0.9.0, which ships the ROMs); here, in the driver, this
        # covers the local worker: files with num_workers 0 (DQN's release tests).
        import ale_py  # noqa: F401
    ray.init(num_cpus=max(4, int(config.get("num_workers", 2)) + 2),
             include_dashboard=False, log_to_driver=False)
    algo = get_trainable_cls(experiment["run"])(config=config)
    start, curve = time.time(), []
    while True:
        result = algo.train()
        sampled = result.get("sampler_results", result)
        learner = result.get("info", {}).get("learner", {}).get("default_policy", {})
        stats = learner.get("learner_stats", learner)
        row = {"timesteps_total": result["timesteps_total"],
               "episode_reward_mean": sampled["episode_reward_mean"],
               "entropy": stats.get("entropy"), "vf_explained_var": stats.get("vf_explained_var"),
               "mean_q": stats.get("mean_q"), "seconds": round(time.time() - start, 1)}
        curve.append(row)
        print(json.dumps(row), flush=True)
        reward = row["episode_reward_mean"]
        if (target is not None and reward == reward and reward >= target) or \
                (budget is not None and row["timesteps_total"] >= budget):
            break
    rewards = [r["episode_reward_mean"] for r in curve
               if r["episode_reward_mean"] == r["episode_reward_mean"]]  # not NaN
    print(json.dumps({"file": str(args.file), "experiment": name, "run": experiment["run"],
                      "ray": ray.__version__, "stop": stop, "pass_criteria": criteria,
                      "passed": bool(target is not None and rewards and max(rewards) >= target),
                      "best_reward": max(rewards) if rewards else None, "curve": curve}))
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
