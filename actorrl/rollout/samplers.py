"""The samplers a :class:`~actorrl.rollout.worker.RolloutWorker` collects with: one for a
:class:`~actorrl.envs.VectorEnv` and one policy, one for a
:class:`~actorrl.envs.MultiAgentVectorEnv` with agents mapped to policies.

Each step computes the actions of all envs in one batched forward pass per policy, then
steps the envs one after the other. Every env's (and every agent's) trajectory is kept
apart and handed to the policy's ``postprocess_trajectory`` when its episode ends or the
fragment is cut; a recurrent policy's state is carried per env slot (see the worker's
module docstring for the batch modes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from actorrl.callbacks import EpisodeTracker
from actorrl.data.actions import env_actions as to_env_actions
from actorrl.data.batch import MultiAgentBatch, SampleBatch, chop_into_sequences
from actorrl.envs import ALL_AGENTS, MultiAgentVectorEnv, VectorEnv
from actorrl.envs.filters import MeanStdFilter
from actorrl.policy.base import TorchPolicy


class _Trajectory:
    """Rows of one agent in one env since the last flush, column by column."""

    __slots__ = ("columns", "num_rows")

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {}
        self.num_rows = 0

    def add(self, row: Mapping[str, Any]) -> None:
        if not self.columns:
            self.columns = {key: [] for key in row}
        for key, value in row.items():
            self.columns[key].append(value)
        self.num_rows += 1

    def flush(self, policy: TorchPolicy) -> SampleBatch:
        """The rows as a postprocessed batch (a recurrent policy's cut into sequences);
        the trajectory is emptied."""
        batch = SampleBatch({key: np.asarray(values) for key, values in self.columns.items()})
        self.columns = {}
        self.num_rows = 0
        batch = policy.postprocess_trajectory(batch)
        if policy.is_recurrent:
            batch = chop_into_sequences(batch, policy.max_seq_len)
        return batch


@dataclass(frozen=True)
class SamplingOptions:
    """How a sampler collects (from the rollout config)."""

    fragment_length: int
    complete_episodes: bool
    explore: bool
    clip_actions: bool
    rng: np.random.Generator
    normalize_actions: bool = False


class Sampler:
    """The settings both samplers read, as attributes."""

    def __init__(self, options: SamplingOptions) -> None:
        self.fragment_length = options.fragment_length
        self.complete_episodes = options.complete_episodes
        self.explore = options.explore
        self.clip_actions = options.clip_actions
        self.normalize_actions = options.normalize_actions
        self.rng = options.rng

    def env_actions(self, space: gym.Space, actions: np.ndarray) -> Any:
        """The policy's ``actions`` as the env takes them (see
        :func:`actorrl.data.actions.env_actions`); the batch keeps ``actions``."""
        return to_env_actions(space, actions, normalize=self.normalize_actions,
                              clip=self.clip_actions)


class SingleAgentSampler(Sampler):
    """Collects from a :class:`VectorEnv` with one policy."""

    def __init__(self, env: VectorEnv, policy: TorchPolicy, options: SamplingOptions
                 ) -> None:
        super().__init__(options)
        self.env = env
        self.policy = policy
        n = env.num_envs
        self.obs: np.ndarray | None = None
        self.trajectories = [_Trajectory() for _ in range(n)]
        self.eps_ids = self.rng.integers(0, 2**62, size=n)
        self.episode_steps = np.zeros(n, dtype=np.int64)
        self.agent_index = np.zeros(n, dtype=np.int64)
        self.episode_tracker: EpisodeTracker | None = None
        self.recurrent = _RecurrentSlots(policy, env.action_space, n) \
            if policy.is_recurrent else None

    def sample(self) -> SampleBatch:
        if self.obs is None:
            self.obs = self.env.reset()
            if self.episode_tracker is not None:
                for i, episode_id in enumerate(self.eps_ids.tolist()):
                    self.episode_tracker.start(i, episode_id)
        pieces: list[list[SampleBatch]] = [[] for _ in range(self.env.num_envs)]
        if self.complete_episodes:
            target_env_steps = self.fragment_length * self.env.num_envs
            collected = 0
            while collected < target_env_steps:
                collected += self._step(pieces)
        else:
            for _ in range(self.fragment_length):
                self._step(pieces)
            for i, trajectory in enumerate(self.trajectories):
                if trajectory.num_rows:
                    pieces[i].append(trajectory.flush(self.policy))
        return SampleBatch.concat_samples([p for env_pieces in pieces for p in env_pieces])

    def _step(self, pieces: list[list[SampleBatch]]) -> int:
        """One step of every env; returns env steps of the episodes that ended."""
        obs = self.obs
        assert obs is not None
        recurrent = self.recurrent
        if recurrent is None:
            actions, extras = self.policy.compute_actions(obs, explore=self.explore)
        else:
            actions, extras = self.policy.compute_actions(obs, explore=self.explore,
                                                          **recurrent.inputs())
            extras = recurrent.record(extras)
        step = self.env.step(self.env_actions(self.env.action_space, actions))
        columns = {
            SampleBatch.OBS: obs,
            SampleBatch.ACTIONS: actions,
            SampleBatch.REWARDS: step.rewards,
            SampleBatch.NEXT_OBS: step.next_obs,
            SampleBatch.TERMINATEDS: step.terminateds,
            SampleBatch.TRUNCATEDS: step.truncateds,
            SampleBatch.EPS_ID: self.eps_ids,
            SampleBatch.T: self.episode_steps,
            SampleBatch.AGENT_INDEX: self.agent_index,
            **extras,
        }
        finished_steps = 0
        for i, trajectory in enumerate(self.trajectories):
            trajectory.add({key: column[i] for key, column in columns.items()})
        self.episode_steps = self.episode_steps + 1
        if recurrent is not None:
            recurrent.advance(actions, step.rewards, step.dones)
        for i in np.flatnonzero(step.dones).tolist():
            pieces[i].append(self.trajectories[i].flush(self.policy))
            finished_steps += int(self.episode_steps[i])
            self.episode_steps[i] = 0
            self.eps_ids[i] = self.rng.integers(0, 2**62)
        if self.episode_tracker is not None:
            self.episode_tracker.step(step.rewards, step.infos, actions, step.dones,
                                      self.eps_ids)
        self.obs = step.obs
        return finished_steps


class _RecurrentSlots:
    """A recurrent policy's per-env inputs in a worker: each env slot's state (and previous
    action and reward, when the model reads them), carried across steps and ``sample()``
    calls and reset to the initial state when the slot's episode ends."""

    def __init__(self, policy: TorchPolicy, action_space: gym.Space, num_envs: int) -> None:
        self.initial = policy.get_initial_state()
        self.state = [np.repeat(s[None], num_envs, axis=0) for s in self.initial]
        self.use_prev_actions = policy.recurrent_inputs.prev_actions
        self.use_prev_rewards = policy.recurrent_inputs.prev_rewards
        action_dtype = np.int64 if isinstance(action_space, gym.spaces.Discrete) \
            else np.float32
        self.prev_actions = np.zeros((num_envs, *action_space.shape), dtype=action_dtype)
        self.prev_rewards = np.zeros(num_envs, dtype=np.float32)
        self._next_state: list[np.ndarray] = self.state

    def inputs(self) -> dict[str, Any]:
        """The keyword arguments of ``compute_actions`` for this step."""
        return {"state": self.state,
                "prev_actions": self.prev_actions if self.use_prev_actions else None,
                "prev_rewards": self.prev_rewards if self.use_prev_rewards else None}

    def record(self, extras: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The columns to store for this step: ``extras`` with the policy's state outputs
        swapped for this step's state inputs (and the previous action/reward when read)."""
        columns = {k: v for k, v in extras.items() if not k.startswith(SampleBatch.STATE_OUT)}
        self._next_state = [extras[f"{SampleBatch.STATE_OUT}{k}"]
                            for k in range(len(self.state))]
        for k, state in enumerate(self.state):
            columns[f"{SampleBatch.STATE_IN}{k}"] = state
        if self.use_prev_actions:
            columns[SampleBatch.PREV_ACTIONS] = self.prev_actions
        if self.use_prev_rewards:
            columns[SampleBatch.PREV_REWARDS] = self.prev_rewards
        return columns

    def advance(self, actions: np.ndarray, rewards: np.ndarray, dones: np.ndarray) -> None:
        """Move to the next step: the state outputs become the inputs; slots whose episode
        ended start again from the initial state."""
        # The stored rows of this step view the current arrays, so nothing is written into
        # them: the next step's arrays are the policy's outputs (and this step's actions and
        # rewards) as they are, copied only where an ended episode's slot must be reset.
        self.state = self._next_state
        self.prev_actions = np.asarray(actions, dtype=self.prev_actions.dtype)
        self.prev_rewards = np.asarray(rewards, dtype=np.float32)
        ended = np.flatnonzero(dones)
        if len(ended):
            self.state = [s.copy() for s in self.state]
            self.prev_actions = self.prev_actions.copy()
            self.prev_rewards = self.prev_rewards.copy()
            for state, start in zip(self.state, self.initial):
                state[ended] = start
            self.prev_actions[ended] = 0
            self.prev_rewards[ended] = 0.0


@dataclass
class _PendingAction:
    """An agent's action waiting for the agent's next observation."""

    obs: np.ndarray
    action: Any
    extras: dict[str, Any]
    reward: float
    policy_id: str


class MultiAgentSampler(Sampler):
    """Collects from a :class:`MultiAgentVectorEnv`, one batched forward per policy."""

    def __init__(self, env: MultiAgentVectorEnv, policies: Mapping[str, TorchPolicy],
                 mapping_fn: Callable[[str], str], options: SamplingOptions,
                 obs_filters: Mapping[str, MeanStdFilter] | None = None) -> None:
        super().__init__(options)
        recurrent = sorted(pid for pid, p in policies.items() if p.is_recurrent)
        if recurrent:
            raise ValueError(f"recurrent policies ({', '.join(recurrent)}: model option "
                             "'use_lstm') are not supported in multi-agent envs yet")
        self.env = env
        self.policies = policies
        self.mapping_fn = mapping_fn
        self.obs_filters = dict(obs_filters or {})
        """Policy id -> the filter of its agents' observations (RLlib's per-policy
        filters); every observation updates it once, as it arrives."""
        # Per-policy episode rewards: the env asks which policy each agent acted with.
        env.policy_of = lambda i, agent_id: self.agent_policy[i].get(agent_id)
        n = env.num_envs
        self.obs: list[dict[str, Any]] | None = None
        self.trajectories: list[dict[str, _Trajectory]] = [{} for _ in range(n)]
        self.pending: list[dict[str, _PendingAction]] = [{} for _ in range(n)]
        self.agent_policy: list[dict[str, str]] = [{} for _ in range(n)]
        self.agent_index: list[dict[str, int]] = [{} for _ in range(n)]
        self.agent_steps: list[dict[str, int]] = [{} for _ in range(n)]
        self.done_agents: list[set[str]] = [set() for _ in range(n)]
        self.eps_ids = self.rng.integers(0, 2**62, size=n)
        self.episode_steps = [0] * n
        # postprocessed pieces of each env's current episode, per policy
        self.episode_pieces: list[list[tuple[str, SampleBatch]]] = [[] for _ in range(n)]

    def sample(self) -> MultiAgentBatch:
        if self.obs is None:
            self.obs = [self._filtered(i, obs) for i, obs in enumerate(self.env.reset())]
        out: list[tuple[str, SampleBatch]] = []
        if self.complete_episodes:
            env_steps = 0
            target_env_steps = self.fragment_length * self.env.num_envs
            while env_steps < target_env_steps:
                env_steps += self._step(out)
        else:
            for _ in range(self.fragment_length):
                self._step(out)
            env_steps = self.fragment_length * self.env.num_envs
            for i in range(self.env.num_envs):
                self._flush_env(i)
                out.extend(self.episode_pieces[i])
                self.episode_pieces[i] = []
        per_policy: dict[str, list[SampleBatch]] = {}
        for pid, piece in out:
            per_policy.setdefault(pid, []).append(piece)
        return MultiAgentBatch(
            {pid: SampleBatch.concat_samples(b) for pid, b in per_policy.items()}, env_steps)

    def _policy_id(self, i: int, agent_id: str) -> str:
        pid = self.agent_policy[i].get(agent_id)
        if pid is None:
            pid = self.mapping_fn(agent_id)
            if pid not in self.policies:
                raise ValueError(f"policy_mapping_fn({agent_id!r}) returned {pid!r}, not one of "
                                 f"{sorted(self.policies)}")
            self.agent_policy[i][agent_id] = pid
            self.agent_index[i][agent_id] = len(self.agent_index[i])
        return pid

    def _step(self, out: list[tuple[str, SampleBatch]]) -> int:
        """One step of every env; returns env steps of the episodes that ended."""
        assert self.obs is not None
        groups: dict[str, tuple[list[tuple[int, str]], list[Any]]] = {}
        for i, obs_dict in enumerate(self.obs):
            for agent_id, agent_obs in obs_dict.items():
                if agent_id not in self.done_agents[i]:
                    keys, obs_rows = groups.setdefault(self._policy_id(i, agent_id), ([], []))
                    keys.append((i, agent_id))
                    obs_rows.append(agent_obs)
        action_dicts: list[dict[str, Any]] = [{} for _ in range(self.env.num_envs)]
        for pid, (keys, obs_rows) in groups.items():
            policy = self.policies[pid]
            obs = np.stack(obs_rows)
            actions, extras = policy.compute_actions(obs, explore=self.explore)
            env_actions = self.env_actions(policy.action_space, actions)
            for j, (i, agent_id) in enumerate(keys):
                action_dicts[i][agent_id] = env_actions[j]
                self.pending[i][agent_id] = _PendingAction(
                    obs[j], actions[j], {k: v[j] for k, v in extras.items()}, 0.0, pid)
        finished_steps = 0
        for i, step in enumerate(self.env.step(action_dicts)):
            self.episode_steps[i] += 1
            step_obs = self._filtered(i, step.obs)
            self._close_transitions(i, step_obs, step.rewards, step.terminateds,
                                    step.truncateds, step.episode_done)
            if step.episode_done:
                self._flush_env(i)
                if self.complete_episodes:
                    out.extend(self.episode_pieces[i])
                    self.episode_pieces[i] = []
                finished_steps += self.episode_steps[i]
                self._start_episode(i)
                self.obs[i] = self._filtered(i, step.reset_obs or {})
            else:
                self.obs[i] = step_obs
        return finished_steps

    def _filtered(self, i: int, obs: dict[str, Any]) -> dict[str, Any]:
        """Env ``i``'s observations through their policies' filters (unchanged without)."""
        if not self.obs_filters or not obs:
            return obs
        out = dict(obs)
        groups: dict[str, list[str]] = {}
        for agent_id in obs:
            groups.setdefault(self._policy_id(i, agent_id), []).append(agent_id)
        for pid, agents in groups.items():
            obs_filter = self.obs_filters.get(pid)
            if obs_filter is not None:
                rows = obs_filter(np.stack([obs[a] for a in agents]))
                out.update(zip(agents, rows))
        return out

    def _close_transitions(self, i: int, obs: dict, rewards: dict, terminateds: dict,
                           truncateds: dict, episode_done: bool) -> None:
        pending = self.pending[i]
        for agent_id, reward in rewards.items():
            if agent_id in pending:
                pending[agent_id].reward += float(reward)
        for agent_id in list(pending):
            agent_terminated = bool(terminateds.get(agent_id, False))
            agent_truncated = bool(truncateds.get(agent_id, False))
            if not (agent_id in obs or agent_terminated or agent_truncated or episode_done):
                continue  # not this agent's turn yet: keep summing its rewards
            act = pending.pop(agent_id)
            terminated = agent_terminated or bool(terminateds[ALL_AGENTS])
            truncated = not terminated and (agent_truncated or bool(truncateds[ALL_AGENTS]))
            t = self.agent_steps[i].get(agent_id, 0)
            self.agent_steps[i][agent_id] = t + 1
            trajectory = self.trajectories[i].setdefault(agent_id, _Trajectory())
            trajectory.add({
                SampleBatch.OBS: act.obs,
                SampleBatch.ACTIONS: act.action,
                SampleBatch.REWARDS: np.float32(act.reward),
                SampleBatch.NEXT_OBS: obs.get(agent_id, act.obs),
                SampleBatch.TERMINATEDS: terminated,
                SampleBatch.TRUNCATEDS: truncated,
                SampleBatch.EPS_ID: self.eps_ids[i],
                SampleBatch.T: t,
                SampleBatch.AGENT_INDEX: self.agent_index[i][agent_id],
                **act.extras,
            })
            if terminated or truncated:
                self.done_agents[i].add(agent_id)
                self._flush_agent(i, agent_id)

    def _flush_agent(self, i: int, agent_id: str) -> None:
        trajectory = self.trajectories[i].get(agent_id)
        if trajectory is not None and trajectory.num_rows:
            pid = self.agent_policy[i][agent_id]
            self.episode_pieces[i].append((pid, trajectory.flush(self.policies[pid])))

    def _flush_env(self, i: int) -> None:
        for agent_id in self.trajectories[i]:
            self._flush_agent(i, agent_id)

    def _start_episode(self, i: int) -> None:
        self.trajectories[i] = {}
        self.pending[i] = {}
        self.agent_policy[i] = {}
        self.agent_index[i] = {}
        self.agent_steps[i] = {}
        self.done_agents[i] = set()
        self.eps_ids[i] = self.rng.integers(0, 2**62)
        self.episode_steps[i] = 0
