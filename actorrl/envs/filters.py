"""Observation filters (RLlib's ``observation_filter``): ``NoFilter`` and ``MeanStdFilter``.

Running statistics
    :class:`RunningStat` keeps a count, mean and sum of squared deviations (Welford's
    algorithm); two of them merge exactly (Chan et al.'s parallel update), so statistics
    gathered apart equal those of the data taken together. The standard deviation is the
    sample one (``n - 1``); with a single observation it is ``|mean|``, as in RLlib.

MeanStdFilter
    Each observation first updates the statistics, then is returned as
    ``clip((x - mean) / (std + 1e-8), -10, 10)`` (float32). Besides the total statistics
    ``rs`` a filter keeps ``buffer``: what it saw since its delta was last taken.

Synchronisation (RLlib's ``FilterManager.synchronize``)
    Once per training iteration the driver takes every worker's delta
    (:meth:`MeanStdFilter.flush_delta`: the buffer, which is then cleared), merges them into
    the master filter (:meth:`MeanStdFilter.apply_delta`) and sends the master statistics
    back to every worker (:meth:`MeanStdFilter.sync`). A worker's statistics become the
    master's plus whatever it observed since its delta was taken (RLlib drops those few
    observations from the worker's view until the next sync; keeping them loses nothing
    when workers sample while the driver merges, as in the asynchronous pipelines).

States travel and are checkpointed as plain dicts of numbers and arrays
(:meth:`RunningStat.to_state`), never pickled.

:class:`FilteredVectorEnv` wraps a :class:`~actorrl.envs.VectorEnv` so every observation
the sampler sees (what it acts on and what it stores, ``obs`` and ``new_obs``) is
filtered. In multi-agent envs each policy has its own filter (:func:`policy_filters`),
applied by the sampler to the observations of the agents mapped to it; deltas, syncs and
checkpoints are ``{policy_id: statistics}`` in both cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from actorrl.data.batch import DEFAULT_POLICY_ID
from actorrl.data.spaces import flat_size, needs_flattening
from actorrl.envs import VectorEnv, VectorStep

NO_FILTER = "NoFilter"
MEAN_STD_FILTER = "MeanStdFilter"
OBSERVATION_FILTERS = (NO_FILTER, MEAN_STD_FILTER)
"""The values ``observation_filter`` accepts."""
CLIP = 10.0
"""RLlib's MeanStdFilter clips filtered observations to [-10, 10]."""
STD_EPSILON = 1e-8


class RunningStat:
    """Count, mean and sum of squared deviations of a stream of arrays of one shape."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.n = 0
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.m2 = np.zeros(self.shape, dtype=np.float64)

    def push_batch(self, rows: np.ndarray) -> None:
        """Add each row of ``rows`` ([k, *shape]) as one observation."""
        rows = np.asarray(rows, dtype=np.float64).reshape((-1, *self.shape))
        if len(rows) == 0:
            return
        other = RunningStat(self.shape)
        other.n = len(rows)
        other.mean = rows.mean(axis=0)
        other.m2 = ((rows - other.mean) ** 2).sum(axis=0)
        self.update(other)

    def update(self, other: RunningStat) -> None:
        """Merge ``other``'s observations into these statistics (exact)."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge running stats of shape {other.shape} into "
                             f"{self.shape}")
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, other.mean.copy(), other.m2.copy()
            return
        total = self.n + other.n
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.n / total)
        self.m2 = self.m2 + other.m2 + delta ** 2 * (self.n * other.n / total)
        self.n = total

    @property
    def var(self) -> np.ndarray:
        """Sample variance (``mean ** 2`` for one observation, as RLlib)."""
        if self.n > 1:
            return self.m2 / (self.n - 1)
        return np.square(self.mean)

    @property
    def std(self) -> np.ndarray:
        """Square root of :attr:`var`."""
        return np.sqrt(self.var)

    def copy(self) -> RunningStat:
        """An independent copy."""
        out = RunningStat(self.shape)
        out.n, out.mean, out.m2 = self.n, self.mean.copy(), self.m2.copy()
        return out

    def to_state(self) -> dict[str, Any]:
        """``{"n", "mean", "m2"}``: plain data for the wire and checkpoints."""
        return {"n": self.n, "mean": self.mean.copy(), "m2": self.m2.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RunningStat:
        """Inverse of :meth:`to_state`."""
        mean = np.array(state["mean"], dtype=np.float64)
        out = cls(mean.shape)
        out.n, out.mean = int(state["n"]), mean
        out.m2 = np.array(state["m2"], dtype=np.float64).reshape(mean.shape)
        return out


class NoFilter:
    """Observations pass unchanged (the default)."""

    name = NO_FILTER

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """``obs`` itself."""
        return obs


class MeanStdFilter:
    """RLlib's MeanStdFilter over observations of ``shape``; see the module docstring."""

    name = MEAN_STD_FILTER

    def __init__(self, shape: Sequence[int], clip: float | None = CLIP) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.clip = clip
        self.rs = RunningStat(self.shape)
        """All observations this filter's statistics cover."""
        self.buffer = RunningStat(self.shape)
        """Observations since the delta was last taken (:meth:`flush_delta`)."""

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """Filter a batch of observations ([k, *shape]); with ``update`` they first join
        the statistics."""
        if update:
            self.rs.push_batch(obs)
            self.buffer.push_batch(obs)
        out = (np.asarray(obs, dtype=np.float64) - self.rs.mean) / (self.rs.std + STD_EPSILON)
        if self.clip is not None:
            out = np.clip(out, -self.clip, self.clip)
        return out.astype(np.float32)

    def flush_delta(self) -> dict[str, Any]:
        """The observations since the last flush, as a state; the buffer is cleared."""
        delta = self.buffer.to_state()
        self.buffer = RunningStat(self.shape)
        return delta

    def apply_delta(self, delta: dict[str, Any]) -> None:
        """Merge a worker's delta (:meth:`flush_delta` output) into the statistics."""
        self.rs.update(RunningStat.from_state(delta))

    def sync(self, master: dict[str, Any]) -> None:
        """Take the master's statistics, plus what this filter saw since its last delta."""
        rs = RunningStat.from_state(master)
        rs.update(self.buffer)
        self.rs = rs

    def get_state(self) -> dict[str, Any]:
        """The total statistics (checkpoints, broadcasts)."""
        return self.rs.to_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output; the buffer is cleared."""
        self.rs = RunningStat.from_state(state)
        self.buffer = RunningStat(self.shape)


ObservationFilter = NoFilter | MeanStdFilter


def make_filter(name: str, shape: Sequence[int]) -> ObservationFilter:
    """The filter ``observation_filter`` names, for observations of ``shape``."""
    if name == NO_FILTER:
        return NoFilter()
    if name == MEAN_STD_FILTER:
        return MeanStdFilter(shape)
    raise ValueError(f"observation_filter must be one of {', '.join(OBSERVATION_FILTERS)}, "
                     f"got {name!r}")


def check_observation_filter(name: Any) -> list[str]:
    """Config problems with an ``observation_filter`` value (empty when it is fine)."""
    if name in OBSERVATION_FILTERS:
        return []
    return [f"observation_filter must be one of {', '.join(map(repr, OBSERVATION_FILTERS))}, "
            f"got {name!r}"]


class FilteredVectorEnv:
    """A :class:`~actorrl.envs.VectorEnv` whose observations pass through ``obs_filter``.

    Every observation updates the filter once: a step's ``next_obs`` rows, and the first
    observations of the episodes that began in it. Everything else forwards to the env.
    """

    def __init__(self, env: VectorEnv, obs_filter: MeanStdFilter) -> None:
        self.env = env
        self.obs_filter = obs_filter

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self) -> np.ndarray:
        """Reset every env; the filtered first observations."""
        return self.obs_filter(self.env.reset())

    def step(self, actions: Any) -> VectorStep:
        """Step every env; ``next_obs`` and ``obs`` filtered."""
        step = self.env.step(actions)
        next_obs = self.obs_filter(step.next_obs)
        obs = next_obs
        dones = step.dones
        if dones.any():
            obs = next_obs.copy()
            obs[dones] = self.obs_filter(step.obs[dones])
        return dataclasses.replace(step, next_obs=next_obs, obs=obs)


def filter_vector_env(name: str, env: Any) -> tuple[Any, ObservationFilter]:
    """The env a worker samples from and its filter: ``env`` itself with :class:`NoFilter`,
    or ``env`` wrapped in a :class:`FilteredVectorEnv` with a :class:`MeanStdFilter`.
    Multi-agent envs come back unwrapped with :class:`NoFilter`: their sampler keeps one
    filter per policy (:func:`policy_filters`)."""
    if name == NO_FILTER or not isinstance(env, VectorEnv):
        return env, NoFilter()
    obs_filter = make_filter(name, filter_shape(env.observation_space))
    assert isinstance(obs_filter, MeanStdFilter)
    return FilteredVectorEnv(env, obs_filter), obs_filter


def policy_filters(name: str, spaces: Mapping[str, gym.Space]) -> dict[str, MeanStdFilter]:
    """One :class:`MeanStdFilter` per policy (policy id -> its observation space) for a
    multi-agent sampler, as RLlib keeps them; empty with ``NoFilter``."""
    if name == NO_FILTER:
        return {}
    filters = {}
    for policy_id, space in spaces.items():
        if needs_flattening(space):
            raise ValueError(f"observation_filter={name!r} in multi-agent envs needs Box "
                             f"observations; policy {policy_id!r} has {space!r}: use "
                             "observation_filter='NoFilter'")
        obs_filter = make_filter(name, filter_shape(space))
        assert isinstance(obs_filter, MeanStdFilter)
        filters[policy_id] = obs_filter
    return filters


def filter_shape(space: gym.Space) -> tuple[int, ...]:
    """The shape of the observations a filter sees for ``space`` (flattened for Dict,
    Tuple...); ``ValueError`` naming ``observation_filter`` for ``Discrete``."""
    if needs_flattening(space):
        return (flat_size(space),)
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape)
    raise ValueError(f"observation_filter 'MeanStdFilter' needs Box, Dict or Tuple "
                     f"observations, got {space!r}; use observation_filter='NoFilter'")


class FilterManager:
    """The driver's master filters, one per policy (RLlib's ``FilterManager.synchronize``):
    merges workers' deltas, hands out the statistics, and is saved in checkpoints. A
    policy's master appears with its first delta; :attr:`states` is None until then."""

    def __init__(self) -> None:
        self.masters: dict[str, MeanStdFilter] = {}

    def apply_deltas(self, worker_filters: Sequence[Mapping[str, dict[str, Any]]]) -> None:
        """Merge each worker's :meth:`~actorrl.rollout.RolloutWorker.get_filters` output
        (``{policy_id: delta}``) into the masters."""
        for filters in worker_filters:
            for policy_id, delta in filters.items():
                master = self.masters.get(policy_id)
                if master is None:
                    master = self.masters[policy_id] = MeanStdFilter(
                        np.asarray(delta["mean"]).shape)
                master.apply_delta(delta)

    @property
    def states(self) -> dict[str, dict[str, Any]] | None:
        """``{policy_id: statistics}`` (None before any delta)."""
        return {pid: m.get_state() for pid, m in self.masters.items()} or None

    @property
    def state(self) -> dict[str, Any] | None:
        """The single-agent policy's statistics (None before any delta)."""
        master = self.masters.get(DEFAULT_POLICY_ID)
        return None if master is None else master.get_state()

    def restore(self, states: Mapping[str, dict[str, Any]] | None) -> None:
        """Take a checkpoint's ``{policy_id: statistics}``."""
        self.masters = {}
        for policy_id, state in (states or {}).items():
            master = self.masters[policy_id] = MeanStdFilter(np.asarray(state["mean"]).shape)
            master.set_state(state)
