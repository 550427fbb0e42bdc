"""``RolloutWorker``: envs plus policies; collects experience and runs policy updates.

Plain synchronous code (no asyncio, no transport): an actor wraps it to run remotely.

Sampling
    Each step computes the actions of all ``num_envs_per_worker`` envs in one batched
    forward pass per policy, then steps the envs one after the other
    (:mod:`actorrl.envs`). Every env's (and, multi-agent, every agent's) trajectory is
    kept apart; a contiguous piece of one episode is handed to the policy's
    ``postprocess_trajectory`` when the episode ends or the fragment is cut, and only then
    joined with the others. ``batch_mode="truncate_episodes"``: every env runs exactly
    ``rollout_fragment_length`` steps per ``sample()``; the batch is grouped by env (env 0's
    rows first), in time order within each env. ``"complete_episodes"``: whole episodes
    only, at least ``rollout_fragment_length * num_envs_per_worker`` env steps; unfinished
    episodes carry over to the next ``sample()``. A recurrent policy's state (and previous
    action and reward, when its model reads them) is carried per env slot across steps and
    ``sample()`` calls and reset at episode start; its fragments are cut into sequences of
    at most ``max_seq_len`` steps (see :mod:`actorrl.policy.base`).

Gradients (RLlib's convention)
    ``compute_gradients(SampleBatch)`` returns the default policy's gradients (a list of
    arrays) and its info; ``compute_gradients(MultiAgentBatch)`` returns
    ``{policy_id: grads}`` and ``{policy_id: info, "batch_count": env_steps}`` for the
    trainable policies in the batch. ``apply_gradients`` takes either form.
    ``learn_on_batch`` always returns ``{policy_id: info}``.

Config: a :class:`~actorrl.config.WorkerConfig` (its ``rollout`` section,
:class:`~actorrl.config.RolloutConfig`, and its ``policy`` section, the policy class's
``config_class``), or a mapping loaded into one by :func:`~actorrl.config.load_worker_config`
(RLlib flat names or sections; unknown keys refused). ``multiagent.policies`` maps policy
id -> ``(policy_cls or "pkg.module:Class" or None, obs_space or None, action_space or
None, config_overrides)``; ``None`` class means the worker's ``policy`` argument, ``None``
spaces are taken from the env's agents mapped to that policy; the overrides are keys of
that policy's config. ``policy_mapping_fn(agent_id) -> policy_id`` (a callable or a path)
is called once per agent per episode. Each policy's config gets the worker's
``worker_index`` and ``num_workers`` where it has those fields (per-worker exploration).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorrl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, chop_into_sequences
from actorrl.callbacks import DefaultCallbacks, EpisodeTracker, make_callbacks
from actorrl.classpath import resolve_callable
from actorrl.config import (
    ConfigSection,
    RolloutConfig,
    WorkerConfig,
    load_component,
    load_worker_config,
)
from actorrl.envs import (
    ALL_AGENTS,
    EnvSpec,
    EpisodeMetrics,
    MultiAgentVectorEnv,
    VectorEnv,
    make_vector_env,
)
from actorrl.filters import MeanStdFilter, filter_vector_env
from actorrl.policy.base import TorchPolicy
from actorrl.policy.config import PolicyConfig

PolicyClass = type[TorchPolicy]


class RolloutWorker:
    """Envs and policies of one worker; see the module docstring.

    ``env``: a gymnasium id, ``"pkg.module:factory"`` or callable (:func:`make_env`).
    ``policy``: the policy class (or its path) for single-agent envs and for multi-agent
    policy specs that name no class. ``worker_index`` is 0 for the local worker, 1..N for
    remote ones; ``seed`` overrides ``config['seed']``.
    """

    def __init__(self, env: EnvSpec, policy: PolicyClass | str | None,
                 config: WorkerConfig | Mapping[str, Any], *, worker_index: int = 0,
                 num_workers: int = 0, seed: int | None = None) -> None:
        default_cls = None if policy is None else resolve_callable(policy, "policy class")
        policy_config_cls = (default_cls.config_class if isinstance(default_cls, type)
                             and issubclass(default_cls, TorchPolicy) else PolicyConfig)
        self.config = load_worker_config(config, policy_config_cls)
        rollout: RolloutConfig = self.config.rollout
        self.rollout_config = rollout
        self.worker_index = worker_index
        self.num_workers = num_workers
        seed = rollout.seed if seed is None else seed
        self.seed = seed
        if seed is not None:
            torch.manual_seed(int(seed) + worker_index)
        self.env = make_vector_env(
            env, rollout.env_config, num_envs=rollout.num_envs_per_worker,
            worker_index=worker_index, num_workers=num_workers, seed=seed)
        self.env, self.obs_filter = filter_vector_env(rollout.observation_filter, self.env)
        multiagent = rollout.multiagent
        self.policy_map: dict[str, TorchPolicy] = {}
        rng = np.random.default_rng(None if seed is None else int(seed) + worker_index)
        sampling = _SamplingOptions(
            fragment_length=rollout.rollout_fragment_length,
            complete_episodes=rollout.batch_mode == "complete_episodes",
            explore=rollout.explore,
            clip_actions=rollout.clip_actions,
            rng=rng,
        )
        if isinstance(self.env, MultiAgentVectorEnv):
            mapping_fn = self._build_multiagent_policies(default_cls, multiagent)
            self.sampler: _SingleAgentSampler | _MultiAgentSampler = _MultiAgentSampler(
                self.env, self.policy_map, mapping_fn, sampling)
        else:
            if multiagent.get("policies"):
                raise ValueError("multiagent.policies is set but env makes single-agent "
                                 "gymnasium envs; multi-agent needs an actorrl.envs."
                                 "MultiAgentEnv")
            if default_cls is None:
                raise ValueError("RolloutWorker needs a policy class for a single-agent env")
            self.policy_map[DEFAULT_POLICY_ID] = default_cls(
                self.env.observation_space, self.env.action_space,
                self._policy_config(default_cls, None, "policy"))
            self.sampler = _SingleAgentSampler(self.env, self.policy_map[DEFAULT_POLICY_ID],
                                               sampling)
        to_train = multiagent.get("policies_to_train")
        self.policies_to_train = list(self.policy_map) if to_train is None else list(to_train)
        unknown = sorted(set(self.policies_to_train) - set(self.policy_map))
        if unknown:
            raise ValueError(f"multiagent.policies_to_train names unknown policies {unknown}; "
                             f"policies are {sorted(self.policy_map)}")
        self.num_env_steps_sampled = 0
        self.callbacks = make_callbacks(rollout.callbacks)
        self.episode_tracker: EpisodeTracker | None = None
        if type(self.callbacks) is not DefaultCallbacks and isinstance(
                self.sampler, _SingleAgentSampler):
            self.episode_tracker = EpisodeTracker(self.callbacks, self, self.env,
                                                  self.policy_map)
            self.sampler.episode_tracker = self.episode_tracker

    # ---- construction helpers ----------------------------------------------------------
    def _policy_config(self, cls: PolicyClass, overrides: Mapping[str, Any] | None,
                       where: str) -> ConfigSection:
        """``cls``'s config: the worker's policy section (or, for another config class,
        that class's defaults) with ``overrides`` (keys of that config) applied, and this
        worker's index, worker count and seed where the class has those fields."""
        config_cls = getattr(cls, "config_class", PolicyConfig)
        base = self.config.policy
        if not isinstance(base, config_cls):
            base = load_component(config_cls, {}, section="policy")
        if overrides:
            base = config_cls.load(overrides, path=f"{where}.", base=base)
        context = {"worker_index": self.worker_index, "num_workers": self.num_workers,
                   "seed": self.seed}
        names = {f.name for f in dataclasses.fields(base)}
        return base.replace(**{k: v for k, v in context.items() if k in names})

    def _build_multiagent_policies(self, default_cls: PolicyClass | None,
                                   multiagent: Mapping[str, Any]) -> Callable[[str], str]:
        specs = multiagent.get("policies") or {}
        if not specs:
            raise ValueError("env makes MultiAgentEnvs: set multiagent.policies "
                             "(policy id -> (policy_cls, obs_space, action_space, config))")
        mapping_spec = multiagent.get("policy_mapping_fn")
        if mapping_spec is None:
            if len(specs) != 1:
                raise ValueError(f"multiagent.policy_mapping_fn is needed with several "
                                 f"policies ({sorted(specs)})")
            only = next(iter(specs))
            mapping_fn: Callable[[str], str] = lambda agent_id: only  # noqa: E731
        else:
            mapping_fn = resolve_callable(mapping_spec, "multiagent.policy_mapping_fn")
        env = self.env
        assert isinstance(env, MultiAgentVectorEnv)
        for pid, spec in specs.items():
            if not isinstance(spec, (tuple, list)) or len(spec) != 4:
                raise ValueError(f"multiagent.policies[{pid!r}] must be (policy_cls, obs_space, "
                                 f"action_space, config), got {spec!r}")
            cls_spec, obs_space, action_space, overrides = spec
            cls = default_cls if cls_spec is None else resolve_callable(
                cls_spec, f"multiagent.policies[{pid!r}] class")
            if cls is None:
                raise ValueError(f"multiagent.policies[{pid!r}] names no policy class and the "
                                 f"worker has no default policy class")
            agents = [a for a in env.possible_agents if mapping_fn(a) == pid]
            if obs_space is None or action_space is None:
                if not agents:
                    raise ValueError(f"multiagent.policies[{pid!r}] gives no spaces and no agent "
                                     f"of {env.possible_agents} maps to it")
                obs_space = obs_space or env.observation_spaces[agents[0]]
                action_space = action_space or env.action_spaces[agents[0]]
            self.policy_map[pid] = cls(obs_space, action_space, self._policy_config(
                cls, overrides, f"multiagent.policies[{pid!r}]"))
        return mapping_fn

    # ---- sampling ----------------------------------------------------------------------
    def sample(self) -> SampleBatch | MultiAgentBatch:
        """One batch of experience (see the module docstring for sizes and order)."""
        batch = self.sampler.sample()
        self.num_env_steps_sampled += batch.count
        self.callbacks.on_sample_end(worker=self, samples=batch)
        return batch

    def sample_with_count(self) -> tuple[SampleBatch | MultiAgentBatch, int]:
        """:meth:`sample` and its env-step count."""
        batch = self.sample()
        return batch, batch.count

    def get_metrics(self) -> EpisodeMetrics:
        """Episodes finished since the last call (mergeable across workers)."""
        return self.env.pop_metrics()

    def pop_custom_metrics(self) -> list[dict[str, float]]:
        """``custom_metrics`` of the episodes ended since the last call (callbacks)."""
        tracker = self.episode_tracker
        return tracker.pop_custom_metrics() if tracker is not None else []

    # ---- observation filters (actorrl.filters) -----------------------------------------
    def get_filters(self, flush_after: bool = False) -> dict[str, dict[str, Any]]:
        """``{policy_id: delta}``: the observation statistics gathered since the last
        flush (cleared when ``flush_after``); empty without a MeanStdFilter."""
        obs_filter = self.obs_filter
        if not isinstance(obs_filter, MeanStdFilter):
            return {}
        delta = obs_filter.flush_delta() if flush_after else obs_filter.buffer.to_state()
        return {DEFAULT_POLICY_ID: delta}

    def sync_filters(self, new_filters: Mapping[str, dict[str, Any] | None]) -> None:
        """Take the driver's merged statistics (``{policy_id: state}``), keeping what
        this worker saw since its last flush."""
        state = new_filters.get(DEFAULT_POLICY_ID)
        if isinstance(self.obs_filter, MeanStdFilter) and state is not None:
            self.obs_filter.sync(state)

    def filter_state(self) -> dict[str, Any] | None:
        """The filter's total statistics (None without a MeanStdFilter)."""
        obs_filter = self.obs_filter
        return obs_filter.get_state() if isinstance(obs_filter, MeanStdFilter) else None

    # ---- learning ----------------------------------------------------------------------
    def compute_gradients(self, batch: SampleBatch | MultiAgentBatch) -> tuple[Any, dict]:
        """Gradients without applying them (forms in the module docstring)."""
        if isinstance(batch, MultiAgentBatch):
            grads: dict[str, list[np.ndarray]] = {}
            info: dict[str, Any] = {}
            for pid, policy_batch in batch.policy_batches.items():
                if pid in self.policies_to_train:
                    grads[pid], info[pid] = self.get_policy(pid).compute_gradients(policy_batch)
            info["batch_count"] = batch.count
            return grads, info
        return self.get_policy(DEFAULT_POLICY_ID).compute_gradients(batch)

    def apply_gradients(self, grads: Mapping[str, list[np.ndarray]] | list[np.ndarray]) -> None:
        """Apply ``{policy_id: grads}`` or the default policy's ``grads``."""
        if isinstance(grads, Mapping):
            for pid, policy_grads in grads.items():
                self.get_policy(pid).apply_gradients(policy_grads)
        else:
            self.get_policy(DEFAULT_POLICY_ID).apply_gradients(grads)

    def learn_on_batch(self, batch: SampleBatch | MultiAgentBatch) -> dict[str, dict[str, Any]]:
        """One update of every trainable policy with data in ``batch``: ``{policy_id: info}``."""
        if isinstance(batch, SampleBatch):
            return {DEFAULT_POLICY_ID: self.get_policy(DEFAULT_POLICY_ID).learn_on_batch(batch)}
        return {pid: self.get_policy(pid).learn_on_batch(policy_batch)
                for pid, policy_batch in batch.policy_batches.items()
                if pid in self.policies_to_train}

    # ---- policies and weights ------------------------------------------------------------
    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> TorchPolicy:
        """The policy ``policy_id``; ``KeyError`` naming the known ids otherwise."""
        try:
            return self.policy_map[policy_id]
        except KeyError:
            raise KeyError(f"no policy {policy_id!r} on this worker; policies are "
                           f"{sorted(self.policy_map)}") from None

    def foreach_policy(self, fn: Callable[[TorchPolicy, str], Any]) -> list[Any]:
        """``[fn(policy, policy_id)]`` over all policies."""
        return [fn(policy, pid) for pid, policy in self.policy_map.items()]

    def foreach_trainable_policy(self, fn: Callable[[TorchPolicy, str], Any]) -> list[Any]:
        """``[fn(policy, policy_id)]`` over ``policies_to_train``."""
        return [fn(self.policy_map[pid], pid) for pid in self.policies_to_train]

    def get_weights(self, policies: list[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """``{policy_id: {param_name: array}}`` for ``policies`` (default: all)."""
        ids = list(self.policy_map) if policies is None else policies
        return {pid: self.get_policy(pid).get_weights() for pid in ids}

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]],
                    global_timestep: int | None = None) -> None:
        """Load :meth:`get_weights` output (any subset of policies); optionally also
        :meth:`set_global_timestep`."""
        for pid, policy_weights in weights.items():
            self.get_policy(pid).set_weights(dict(policy_weights))
        if global_timestep is not None:
            self.set_global_timestep(global_timestep)

    def set_global_timestep(self, timestep: int) -> None:
        """Tell every policy the global env-step count."""
        for policy in self.policy_map.values():
            policy.on_global_timestep(int(timestep))

    def get_state(self) -> dict[str, dict[str, Any]]:
        """``{policy_id: policy.get_state()}`` for checkpoints."""
        return {pid: policy.get_state() for pid, policy in self.policy_map.items()}

    def set_state(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        """Restore :meth:`get_state` output."""
        for pid, policy_state in state.items():
            self.get_policy(pid).set_state(dict(policy_state))

    def stop(self) -> None:
        """Close the envs."""
        self.env.close()


# ---- trajectory collection ---------------------------------------------------------------

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


def _env_actions(action_space: gym.Space, actions: np.ndarray, clip: bool) -> Any:
    """Actions as the env wants them: Python ints for Discrete, clipped rows for Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return actions.tolist()
    if clip and isinstance(action_space, gym.spaces.Box):
        return np.clip(actions, action_space.low, action_space.high)
    return actions


@dataclass(frozen=True)
class _SamplingOptions:
    """How a sampler collects (from the rollout config)."""

    fragment_length: int
    complete_episodes: bool
    explore: bool
    clip_actions: bool
    rng: np.random.Generator


class _Sampler:
    """The settings both samplers read, as attributes."""

    def __init__(self, options: _SamplingOptions) -> None:
        self.fragment_length = options.fragment_length
        self.complete_episodes = options.complete_episodes
        self.explore = options.explore
        self.clip_actions = options.clip_actions
        self.rng = options.rng


class _SingleAgentSampler(_Sampler):
    """Collects from a :class:`VectorEnv` with one policy."""

    def __init__(self, env: VectorEnv, policy: TorchPolicy, options: _SamplingOptions
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
        step = self.env.step(_env_actions(self.env.action_space, actions, self.clip_actions))
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
        # New arrays every step: the stored rows of this step keep viewing the old ones.
        self.state = [np.array(s, copy=True) for s in self._next_state]
        self.prev_actions = np.array(actions, dtype=self.prev_actions.dtype, copy=True)
        self.prev_rewards = np.array(rewards, dtype=np.float32, copy=True)
        for i in np.flatnonzero(dones).tolist():
            for state, start in zip(self.state, self.initial):
                state[i] = start
            self.prev_actions[i] = 0
            self.prev_rewards[i] = 0.0


@dataclass
class _PendingAction:
    """An agent's action waiting for the agent's next observation."""

    obs: np.ndarray
    action: Any
    extras: dict[str, Any]
    reward: float
    policy_id: str


class _MultiAgentSampler(_Sampler):
    """Collects from a :class:`MultiAgentVectorEnv`, one batched forward per policy."""

    def __init__(self, env: MultiAgentVectorEnv, policies: Mapping[str, TorchPolicy],
                 mapping_fn: Callable[[str], str], options: _SamplingOptions) -> None:
        super().__init__(options)
        recurrent = sorted(pid for pid, p in policies.items() if p.is_recurrent)
        if recurrent:
            raise ValueError(f"recurrent policies ({', '.join(recurrent)}: model option "
                             "'use_lstm') are not supported in multi-agent envs yet")
        self.env = env
        self.policies = policies
        self.mapping_fn = mapping_fn
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
            self.obs = self.env.reset()
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
            env_actions = _env_actions(policy.action_space, actions, self.clip_actions)
            for j, (i, agent_id) in enumerate(keys):
                action_dicts[i][agent_id] = env_actions[j]
                self.pending[i][agent_id] = _PendingAction(
                    obs[j], actions[j], {k: v[j] for k, v in extras.items()}, 0.0, pid)
        finished_steps = 0
        for i, step in enumerate(self.env.step(action_dicts)):
            self.episode_steps[i] += 1
            self._close_transitions(i, step.obs, step.rewards, step.terminateds,
                                    step.truncateds, step.episode_done)
            if step.episode_done:
                self._flush_env(i)
                if self.complete_episodes:
                    out.extend(self.episode_pieces[i])
                    self.episode_pieces[i] = []
                finished_steps += self.episode_steps[i]
                self._start_episode(i)
                self.obs[i] = step.reset_obs or {}
            else:
                self.obs[i] = step.obs
        return finished_steps

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
