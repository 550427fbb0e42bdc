"""The restart policy of long runs, shared by cluster jobs and a local ``actorrl train``.

A failure the run can recover from (the learner or a replay shard died, a node holding
them was lost) restarts the run from its last checkpoint. How often that may happen is
counted in a sliding window, not since the run began: a week-long job that loses its
learner once a day never fails, one that crash-loops does. :class:`FailureWindow` keeps
the failure times (wall clock, so a job's window survives a coordinator restart) and
decides each failure: restart after an exponential backoff (1 s, 2 s, 4 s ... at most
60 s, growing with the failures in the window), or give up.

:class:`CarriedCounters` keeps the failure counters of a result's ``info``
(``num_worker_restarts``, ``num_worker_failures``, ...) going across restarts: a restarted
trainer counts from 0 again, and the counters add what the earlier attempts counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from actorrl.util.failures import failure_line as describe_failure

DEFAULT_MAX_FAILURES = 20
"""Failures tolerated within :data:`DEFAULT_FAILURE_WINDOW_S` (a 21st within the window
ends the run)."""
DEFAULT_FAILURE_WINDOW_S = 3600.0
"""The window failures are counted in: one hour."""
BACKOFF_INITIAL_S = 1.0
"""The delay before the first restart of a window."""
BACKOFF_MAX_S = 60.0
"""The longest delay before a restart."""
UNLIMITED = -1
"""``max_failures`` meaning "restart without limit" (Tune's convention)."""

FAILURE_COUNTERS = ("num_worker_restarts", "num_worker_failures", "num_shard_failures",
                    "num_gradients_lost", "num_batches_lost", "num_samples_dropped")
"""Keys of a result's ``info`` that count failures and losses; they continue across
restarts (:class:`CarriedCounters`)."""
__all__ = ["CarriedCounters", "FailureWindow", "RestartDecision", "RestartPolicy", "Rollbacks",
           "describe_failure"]


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    """How many failures a run survives and how long it waits before each restart."""

    max_failures: int | None = DEFAULT_MAX_FAILURES
    """Failures tolerated within ``failure_window_s``; None or -1: no limit, 0: none."""
    failure_window_s: float | None = DEFAULT_FAILURE_WINDOW_S
    """The sliding window failures are counted in, in seconds; None: since the start."""
    backoff_initial_s: float = BACKOFF_INITIAL_S
    """The delay before the first restart within the window (doubling with each more)."""
    backoff_max_s: float = BACKOFF_MAX_S
    """The longest delay before a restart."""

    def problems(self, prefix: str = "") -> list[str]:
        """What is wrong with these settings (empty when valid); ``prefix`` names them
        (``"job."`` for a submission's options, ``"--"`` for the command line)."""
        found = []
        limit = self.max_failures
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < UNLIMITED):
            found.append(f"{prefix}max_failures must be an integer >= 0 (or -1 / null: "
                         f"unlimited), got {limit!r}")
        window = self.failure_window_s
        if window is not None and (not isinstance(window, (int, float))
                                   or isinstance(window, bool) or not window > 0):
            found.append(f"{prefix}failure_window_s must be > 0 seconds (or null: since "
                         f"the start), got {window!r}")
        if not 0 <= self.backoff_initial_s <= self.backoff_max_s:
            found.append("restart backoff must satisfy 0 <= initial <= max, got "
                         f"{self.backoff_initial_s} and {self.backoff_max_s}")
        return found

    @property
    def unlimited(self) -> bool:
        """Whether every failure is restarted."""
        return self.max_failures is None or self.max_failures == UNLIMITED

    def describe(self) -> str:
        """The limit in words (``"at most 20 failures per 3600 s"``)."""
        if self.unlimited:
            return "no failure limit"
        where = (f"per {self.failure_window_s:g} s" if self.failure_window_s is not None
                 else "in the whole run")
        return f"at most {self.max_failures} failures {where}"

    def delay_s(self, failures_in_window: int) -> float:
        """The backoff before the restart that follows the ``failures_in_window``-th
        failure of the window."""
        exponent = min(max(failures_in_window - 1, 0), 30)
        return min(self.backoff_initial_s * 2.0 ** exponent, self.backoff_max_s)


@dataclass(frozen=True)
class RestartDecision:
    """What to do about one failure."""

    restart: bool
    """Whether to restart (False: the run fails)."""
    failures_in_window: int
    """Failures within the window, this one included."""
    delay_s: float
    """How long to wait before restarting."""
    policy: RestartPolicy

    def describe(self) -> str:
        """The decision in words, for logs and error messages."""
        where = (f"within {self.policy.failure_window_s:g} s"
                 if self.policy.failure_window_s is not None else "in this run")
        count = f"failure {self.failures_in_window} {where}"
        if self.restart:
            return f"{count} ({self.policy.describe()}); restarting in {self.delay_s:g} s"
        return f"{count}, over the limit ({self.policy.describe()})"


class FailureWindow:
    """The failures of one run within the policy's window (see the module docstring)."""

    def __init__(self, policy: RestartPolicy, times: Iterable[float] = (),
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock
        self.times: list[float] = [float(t) for t in times]
        """Wall-clock times of the failures still in the window (persist these to keep
        the window across a restart of the process that runs the policy)."""

    def _expire(self, now: float) -> None:
        window = self.policy.failure_window_s
        if window is not None:
            self.times = [t for t in self.times if now - t < window]

    def record(self) -> RestartDecision:
        """Count a failure now and decide whether (and after how long) to restart."""
        now = self.clock()
        self._expire(now)
        self.times.append(now)
        count = len(self.times)
        policy = self.policy
        allowed = policy.unlimited or count <= int(policy.max_failures or 0)
        return RestartDecision(restart=allowed, failures_in_window=count,
                               delay_s=policy.delay_s(count) if allowed else 0.0,
                               policy=policy)

    def in_window(self) -> int:
        """Failures within the window now."""
        self._expire(self.clock())
        return len(self.times)


class CarriedCounters:
    """Failure counters of ``info`` that continue across restarts (see the module
    docstring). ``totals`` is what earlier attempts counted (from :meth:`totals` of a
    previous instance, e.g. a job record)."""

    def __init__(self, totals: Mapping[str, Any] | None = None) -> None:
        self.base: dict[str, int] = {k: int(v) for k, v in (totals or {}).items()
                                     if k in FAILURE_COUNTERS and isinstance(v, (int, float))}
        self.last: dict[str, int] = {}
        """The current attempt's own counts, from its latest result."""

    def apply(self, result: dict[str, Any]) -> None:
        """Add the earlier attempts' counts to ``result["info"]``'s counters, in place."""
        info = result.get("info")
        if not isinstance(info, dict):
            return
        for key in FAILURE_COUNTERS:
            value = info.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.last[key] = value
                info[key] = value + self.base.get(key, 0)

    def restarted(self) -> None:
        """The attempt ended: what it counted becomes part of the base."""
        self.base = self.totals()
        self.last = {}

    def totals(self) -> dict[str, int]:
        """Every attempt's counts so far, per counter."""
        keys = set(self.base) | set(self.last)
        return {k: self.base.get(k, 0) + self.last.get(k, 0) for k in sorted(keys)}


class Rollbacks:
    """What restarts from a checkpoint undid, and how each later result says so.

    A restart rolls the run back to its last checkpoint: the iterations after it are done
    again and the rows already written for them are *superseded* (they stay in
    ``result.jsonl``; :func:`actorrl.experiment.results.current_results` leaves them out).
    After the first rollback, every result carries in ``info``: ``num_restarts`` (rollbacks
    so far), ``restored_iteration`` (the iteration the latest one resumed from),
    ``timesteps_lost`` (env steps of reported results that the rollbacks undid) and
    ``timesteps_sampled_all`` (``timesteps_total`` plus those: every env step sampled).
    Shared by a local run (:class:`actorrl.experiment.recovery.RecoveringTrainer`) and a
    cluster job (:class:`actorrl.cluster.jobs.ManagedJob`, which keeps :meth:`to_record`
    in ``job.json``)."""

    def __init__(self, record: Mapping[str, Any] | None = None) -> None:
        record = record or {}
        self.num_restarts = int(record.get("num_restarts") or 0)
        restored = record.get("restored_iteration")
        self.restored_iteration: int | None = (int(restored) if isinstance(restored, int)
                                               else None)
        self.timesteps_lost = int(record.get("timesteps_lost") or 0)
        self.reported_timesteps = int(record.get("reported_timesteps") or 0)
        """``timesteps_total`` of the latest result reported."""

    def reported(self, result: Mapping[str, Any]) -> None:
        """Note a result as reported (its ``timesteps_total`` is what a later rollback
        would lose beyond its checkpoint's)."""
        timesteps = result.get("timesteps_total")
        if isinstance(timesteps, (int, float)) and not isinstance(timesteps, bool):
            self.reported_timesteps = int(timesteps)

    def restored(self, iteration: int, timesteps_total: int) -> None:
        """A restart resumed from the checkpoint of ``iteration`` (0: from scratch) at
        ``timesteps_total`` env steps."""
        self.num_restarts += 1
        self.restored_iteration = int(iteration)
        self.timesteps_lost += max(self.reported_timesteps - int(timesteps_total), 0)
        self.reported_timesteps = int(timesteps_total)

    def mark(self, result: dict[str, Any]) -> None:
        """Note ``result`` as reported and, after a rollback, add the keys above to its
        ``info`` (in place)."""
        self.reported(result)
        if not self.num_restarts:
            return
        info = result.get("info")
        if not isinstance(info, dict):
            info = result["info"] = {}
        info["num_restarts"] = self.num_restarts
        info["restored_iteration"] = self.restored_iteration
        info["timesteps_lost"] = self.timesteps_lost
        timesteps = result.get("timesteps_total")
        if isinstance(timesteps, (int, float)) and not isinstance(timesteps, bool):
            info["timesteps_sampled_all"] = int(timesteps) + self.timesteps_lost

    def to_record(self) -> dict[str, Any]:
        """The state to persist (:class:`Rollbacks` of it continues it)."""
        return {"num_restarts": self.num_restarts,
                "restored_iteration": self.restored_iteration,
                "timesteps_lost": self.timesteps_lost,
                "reported_timesteps": self.reported_timesteps}
