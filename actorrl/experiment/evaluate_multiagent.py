"""``actorrl evaluate`` for multi-agent checkpoints (a ``multiagent.policies`` config).

The checkpoint's own worker setup is rebuilt (a :class:`~actorrl.rollout.RolloutWorker` with
the checkpoint's config, policies, policy mapping and observation filters), every policy
gets its saved weights, and whole episodes are sampled with ``explore`` off (fixed
policies such as :class:`~actorrl.policy.random_policy.RandomPolicy` act as they always
do) on up to ``MAX_PARALLEL_ENVS`` envs. Episode ``k`` of env ``i`` is seeded from
``seed`` as training seeds its envs, so evaluations repeat exactly.

Beside the episode totals (a zero-sum game's are all 0), the result holds each policy's
per-episode returns (``policy_rewards``) and their means (``policy_reward_mean``): for a
two-player game with rewards +1 / 0 / -1, the share of returns above 0 is the win rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actorrl.experiment.errors import UsageError, error_summary


def is_multi_agent(config: dict[str, Any]) -> bool:
    """Whether a checkpoint's config trains several policies (``multiagent.policies``)."""
    multiagent = config.get("multiagent") or (config.get("rollout") or {}).get("multiagent")
    return bool((multiagent or {}).get("policies"))


def rollout_multi_agent(policy_class: str, env_id: str, env_config: dict[str, Any],
                        config: dict[str, Any], state: dict[str, Any], episodes: int,
                        num_envs: int, seed: int | None
                        ) -> tuple[list[float], list[int], dict[str, list[float]]]:
    """``episodes`` whole episodes of the checkpoint's policies: (episode returns, lengths,
    policy id -> its agents' return in each episode where it played)."""
    from actorrl.rollout import RolloutWorker

    worker_config = {**config, "env_config": env_config, "num_envs_per_worker": num_envs,
                     "explore": False, "batch_mode": "complete_episodes",
                     "rollout_fragment_length": 1}
    try:
        worker = RolloutWorker(env_id, policy_class, worker_config, worker_index=0,
                               num_workers=0, seed=seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        saved = state.get("policies") or {}
        missing = sorted(set(worker.policy_map) - set(saved))
        if missing:
            raise UsageError(f"the checkpoint has no weights for policies {missing}")
        try:
            worker.set_weights({pid: saved[pid]["weights"] for pid in worker.policy_map})
        except (RuntimeError, KeyError) as exc:
            raise UsageError(f"the checkpoint's weights do not fit the policies for "
                             f"{env_id!r}: {error_summary(exc)}") from None
        if state.get("filters"):
            worker.sync_filters(state["filters"])
        returns: list[float] = []
        lengths: list[int] = []
        per_policy: dict[str, list[float]] = {}
        while len(returns) < episodes:
            worker.sample()
            metrics = worker.get_metrics()
            for reward, length, by_policy in zip(metrics.episode_rewards,
                                                 metrics.episode_lengths,
                                                 metrics.policy_rewards):
                if len(returns) == episodes:
                    break
                returns.append(reward)
                lengths.append(length)
                totals: dict[str, float] = {}
                for pid, agent_reward in by_policy:
                    totals[pid] = totals.get(pid, 0.0) + float(agent_reward)
                for pid, total in totals.items():
                    per_policy.setdefault(pid, []).append(total)
    finally:
        worker.stop()
    return returns, lengths, per_policy


def policy_means(per_policy: dict[str, list[float]]) -> dict[str, float]:
    """Each policy's mean return over the episodes it played."""
    return {pid: float(np.mean(values)) for pid, values in sorted(per_policy.items())}
