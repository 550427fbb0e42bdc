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

Config: a :class:`~actorrl.config.rollout.WorkerConfig` (its ``rollout`` section,
:class:`~actorrl.config.rollout.RolloutConfig`, and its ``policy`` section, the policy class's
``config_class``), or a mapping loaded into one by
:func:`~actorrl.config.loading.load_worker_config`
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
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from actorrl.callbacks import DefaultCallbacks, EpisodeTracker, make_callbacks
from actorrl.config.loading import load_component, load_worker_config
from actorrl.config.rollout import RolloutConfig, WorkerConfig
from actorrl.config.sections import ConfigSection
from actorrl.data.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from actorrl.envs import EnvSpec, EpisodeMetrics, MultiAgentVectorEnv, make_vector_env
from actorrl.envs.filters import MeanStdFilter, filter_vector_env, policy_filters
from actorrl.policy.base import TorchPolicy
from actorrl.policy.config import PolicyConfig
from actorrl.rollout.samplers import MultiAgentSampler, SamplingOptions, SingleAgentSampler
from actorrl.util.classpath import resolve_callable

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
                 num_workers: int = 0, seed: int | None = None,
                 record_video: bool = False) -> None:
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
        self.video_dir: str | None = (tempfile.mkdtemp(prefix="actorrl-videos-")
                                      if record_video else None)
        """Where this worker's envs write episode mp4s until :meth:`pop_videos` takes
        them (``record_video``; see :mod:`actorrl.envs.video`)."""
        try:
            self.env = make_vector_env(
                env, rollout.env_config, num_envs=rollout.num_envs_per_worker,
                worker_index=worker_index, num_workers=num_workers, seed=seed,
                horizon=rollout.horizon, record_video=self.video_dir)
        except BaseException:
            self._remove_video_dir()
            raise
        self.env, obs_filter = filter_vector_env(rollout.observation_filter, self.env)
        self.obs_filters: dict[str, MeanStdFilter] = (
            {DEFAULT_POLICY_ID: obs_filter} if isinstance(obs_filter, MeanStdFilter) else {})
        """The observation filters, per policy (empty with ``NoFilter``)."""
        multiagent = rollout.multiagent
        self.policy_map: dict[str, TorchPolicy] = {}
        rng = np.random.default_rng(None if seed is None else int(seed) + worker_index)
        sampling = SamplingOptions(
            fragment_length=rollout.rollout_fragment_length,
            complete_episodes=rollout.batch_mode == "complete_episodes",
            explore=rollout.explore,
            clip_actions=rollout.clip_actions,
            normalize_actions=rollout.normalize_actions,
            rng=rng,
        )
        if isinstance(self.env, MultiAgentVectorEnv):
            mapping_fn = self._build_multiagent_policies(default_cls, multiagent)
            self.obs_filters = policy_filters(rollout.observation_filter, {
                pid: policy.observation_space for pid, policy in self.policy_map.items()})
            self.sampler: SingleAgentSampler | MultiAgentSampler = MultiAgentSampler(
                self.env, self.policy_map, mapping_fn, sampling, self.obs_filters)
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
            self.sampler = SingleAgentSampler(self.env, self.policy_map[DEFAULT_POLICY_ID],
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
                self.sampler, SingleAgentSampler):
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
                   "seed": self.seed,
                   "normalize_actions": self.config.rollout.normalize_actions}
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
                # No agent maps to it: every agent's spaces, when they all share them (as
                # RLlib falls back to a multi-agent env's one space).
                source = agents[0] if agents else _shared_spaces_agent(env)
                if source is None:
                    raise ValueError(f"multiagent.policies[{pid!r}] gives no spaces and no agent "
                                     f"of {env.possible_agents} maps to it (and the agents' "
                                     "spaces differ): give its spaces, or map an agent to it")
                obs_space = obs_space or env.observation_spaces[source]
                action_space = action_space or env.action_spaces[source]
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

    # ---- observation filters (actorrl.envs.filters) -----------------------------------------
    def get_filters(self, flush_after: bool = False) -> dict[str, dict[str, Any]]:
        """``{policy_id: delta}``: the observation statistics gathered since the last
        flush (cleared when ``flush_after``); empty without a MeanStdFilter."""
        return {pid: f.flush_delta() if flush_after else f.buffer.to_state()
                for pid, f in self.obs_filters.items()}

    def sync_filters(self, new_filters: Mapping[str, dict[str, Any] | None]) -> None:
        """Take the driver's merged statistics (``{policy_id: state}``), keeping what
        this worker saw since its last flush."""
        for pid, state in new_filters.items():
            obs_filter = self.obs_filters.get(pid)
            if obs_filter is not None and state is not None:
                obs_filter.sync(state)

    def filter_state(self) -> dict[str, Any] | None:
        """The single-agent filter's total statistics (None without a MeanStdFilter)."""
        obs_filter = self.obs_filters.get(DEFAULT_POLICY_ID)
        return None if obs_filter is None else obs_filter.get_state()

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

    def get_weights(self, policies: list[str] | None = None, acting_only: bool = False
                    ) -> dict[str, dict[str, np.ndarray]]:
        """``{policy_id: {param_name: array}}`` for ``policies`` (default: all); with
        ``acting_only`` each policy's :meth:`~actorrl.policy.base.TorchPolicy.
        acting_weight_names` only (what rollout workers load)."""
        ids = list(self.policy_map) if policies is None else policies
        return {pid: self.get_policy(pid).get_weights(acting_only) for pid in ids}

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

    def pop_videos(self) -> list[tuple[str, bytes]]:
        """The episode videos written since the last call, as ``(file name, mp4 bytes)``
        sorted by name, removed from this worker (empty unless built with
        ``record_video``). An episode's file exists once the next one has started."""
        if self.video_dir is None:
            return []
        videos = []
        for name in sorted(os.listdir(self.video_dir)):
            path = os.path.join(self.video_dir, name)
            if name.endswith(".mp4") and os.path.isfile(path):
                with open(path, "rb") as f:
                    videos.append((name, f.read()))
                os.remove(path)
        return videos

    def stop(self) -> None:
        """Close the envs (and drop videos not taken by :meth:`pop_videos`)."""
        try:
            self.env.close()
        finally:
            self._remove_video_dir()

    def _remove_video_dir(self) -> None:
        if self.video_dir is not None:
            shutil.rmtree(self.video_dir, ignore_errors=True)


# ---- trajectory collection ---------------------------------------------------------------


def _shared_spaces_agent(env: MultiAgentVectorEnv) -> Any:
    """An agent of ``env`` whose observation and action spaces every agent has (None when
    they differ or there are no agents)."""
    agents = list(env.possible_agents)
    if not agents:
        return None
    first = agents[0]
    same = all(env.observation_spaces[a] == env.observation_spaces[first]
               and env.action_spaces[a] == env.action_spaces[first] for a in agents)
    return first if same else None
