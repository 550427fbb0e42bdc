"""Multi-agent learning results: a trained policy's return against fixed opponents.

    python benchmarks/multiagent_learning.py ALGO --config FILE [--policy learner]
        [--max-minutes M] [--set KEY=VALUE ...] [--thresholds 0,0.5,0.8,0.9]
        [--episodes 1000] [--results DIR] [--out DIR]

In a zero-sum game every episode's total is 0, so :mod:`benchmarks.learning`'s
``episode_reward_mean`` says nothing; this script follows one policy's return instead
(``policy_reward_mean[POLICY]``, the mean over the last 100 episodes in which it played).
It runs ``actorrl train ALGO --config FILE`` as :mod:`benchmarks.learning` does (a
subprocess; its stop criteria and the ``--max-minutes`` bound), then:

- ``thresholds``: each return threshold -> ``{"env_steps", "seconds"}`` of the first
  iteration whose ``policy_reward_mean[POLICY]`` reached it (null if none did);
- ``final_return`` / ``best_return`` of that policy, ``env_steps``, ``seconds``,
  ``env_steps_per_s``, ``peak_pss_mb``;
- ``evaluation``: ``actorrl evaluate`` of the final checkpoint over ``--episodes`` games
  (``explore`` off, seed 0): the policy's mean return and its share of wins (return > 0),
  draws (0) and losses (< 0);
- ``baseline``: the same games with every policy replaced by
  :class:`~actorrl.policy.random_policy.RandomPolicy` (uniform over legal moves), the
  reference a learned policy is measured against.

It writes ``<out>/<algo>-<env>.json``, the curve as ``.csv`` (env steps, seconds, the
policy's mean return, mean episode length) and ``.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))

from actorrl.experiment.results import read_results  # noqa: E402
from benchmarks.end_to_end import finite  # noqa: E402
from benchmarks.learning import train  # noqa: E402

RANDOM_POLICY = "actorrl.policy.random_policy:RandomPolicy"


def policy_return(row: dict[str, Any], policy: str) -> float | None:
    """``policy_reward_mean[policy]`` of one result row (None when absent)."""
    return finite((row.get("policy_reward_mean") or {}).get(policy))


def summarize(rows: list[dict[str, Any]], policy: str, thresholds: list[float]
              ) -> dict[str, Any]:
    """Thresholds reached by ``policy``'s mean return, its final and best, steps, speed."""
    reached: dict[str, dict[str, float] | None] = {}
    for threshold in thresholds:
        first = next((r for r in rows if (m := policy_return(r, policy)) is not None
                      and m >= threshold), None)
        reached[f"{threshold:g}"] = None if first is None else {
            "env_steps": int(first["timesteps_total"]),
            "seconds": round(float(first["time_total_s"]), 1)}
    means = [m for m in (policy_return(r, policy) for r in rows) if m is not None]
    last = rows[-1] if rows else {}
    steps, seconds = int(last.get("timesteps_total", 0)), float(last.get("time_total_s", 0))
    return {"thresholds": reached, "final_return": means[-1] if means else None,
            "best_return": max(means) if means else None, "env_steps": steps,
            "seconds": round(seconds, 1),
            "env_steps_per_s": round(steps / seconds, 1) if seconds > 0 else None}


def outcomes(returns: list[float]) -> dict[str, Any]:
    """Games, mean return and the shares of wins (> 0), draws (0) and losses (< 0)."""
    n = max(len(returns), 1)
    return {"games": len(returns), "mean_return": round(sum(returns) / n, 4),
            "win_rate": round(sum(r > 0 for r in returns) / n, 4),
            "draw_rate": round(sum(r == 0 for r in returns) / n, 4),
            "loss_rate": round(sum(r < 0 for r in returns) / n, 4)}


def evaluate(run_dir: Path, policy: str, episodes: int) -> dict[str, Any]:
    """The final checkpoint's games (greedy), as ``actorrl evaluate`` plays them."""
    from actorrl.experiment.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(run_dir, episodes, seed=0)
    return {"checkpoint": result.checkpoint,
            **outcomes(result.policy_rewards.get(policy, []))}


def random_baseline(config: dict[str, Any], policy: str, episodes: int) -> dict[str, Any]:
    """The same games with every policy uniformly random (legal moves only)."""
    from actorrl.algorithms import get_algorithm
    from actorrl.rollout import RolloutWorker

    rollout = dict(config.get("rollout") or {})
    multiagent = dict(config.get("multiagent") or rollout.get("multiagent") or {})
    multiagent["policies"] = {pid: [RANDOM_POLICY, None, None, {}]
                              for pid in multiagent["policies"]}
    multiagent["policies_to_train"] = []
    rollout.pop("multiagent", None)
    worker_config = {**config, "rollout": rollout, "multiagent": multiagent,
                     "num_envs_per_worker": 16, "batch_mode": "complete_episodes",
                     "rollout_fragment_length": 1}
    spec = get_algorithm(str(config["algorithm"])) if "algorithm" in config else None
    worker = RolloutWorker(config["env"], spec.policy if spec else None, worker_config,
                           seed=0)
    returns: list[float] = []
    try:
        while len(returns) < episodes:
            worker.sample()
            for by_policy in worker.get_metrics().policy_rewards:
                returns += [float(r) for pid, r in by_policy if pid == policy]
    finally:
        worker.stop()
    return outcomes(returns[:episodes])


def write_curve(rows: list[dict[str, Any]], policy: str, csv_path: Path, png_path: Path,
                title: str) -> None:
    """The policy's learning curve as CSV and PNG (return against env steps)."""
    points = [(int(r["timesteps_total"]), round(float(r["time_total_s"]), 1),
               policy_return(r, policy), finite(r.get("episode_len_mean"))) for r in rows]
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["env_steps", "seconds", f"policy_reward_mean_{policy}",
                         "episode_len_mean"])
        writer.writerows(points)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p[0] for p in points], [p[2] for p in points])
    ax.set_xlabel("env steps (moves of both players)")
    ax.set_ylabel(f"{policy} mean return (100 games)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def main() -> None:
    """Train, evaluate, compare with random play; print and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algo")
    parser.add_argument("--config", required=True, help="config file (examples/*.yaml)")
    parser.add_argument("--policy", default="learner", help="the policy to follow")
    parser.add_argument("--max-minutes", type=float, default=30.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--thresholds", default="0,0.5,0.8,0.9")
    parser.add_argument("--episodes", type=int, default=1000,
                        help="games of the final evaluation and of the random baseline")
    parser.add_argument("--results", default=str(REPO / "results" / "learning"))
    parser.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = parser.parse_args()
    args.restore = None
    signal.signal(signal.SIGINT, signal.default_int_handler)

    run_dir, peak_pss_mb, code = train(args, Path(args.results))
    config = json.loads((run_dir / "config.json").read_text())
    env = str(config["env"])
    rows = read_results(run_dir)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    config.setdefault("algorithm", args.algo)
    summary = {
        "algorithm": args.algo, "env": env, "config": args.config, "overrides": args.set,
        "policy": args.policy, "runs": [str(run_dir)], "exit_code": code,
        **summarize(rows, args.policy, thresholds),
        "peak_pss_mb": round(peak_pss_mb, 1),
        "evaluation": evaluate(run_dir, args.policy, args.episodes),
        "baseline": random_baseline(config, args.policy, args.episodes),
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.algo}-{env.replace('/', '_')}"
    write_curve(rows, args.policy, out_dir / f"{stem}.csv", out_dir / f"{stem}.png",
                f"{args.algo} {env}: {args.policy} vs random")
    text = json.dumps(summary, indent=2)
    (out_dir / f"{stem}.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
