"""Evaluation during training (RLlib's ``evaluation_interval`` and friends).

Separate evaluation workers (rollout worker actors built from
:meth:`AlgorithmConfig.evaluation_worker_config`: ``explore`` off unless
``evaluation_config`` says otherwise) receive the learner's weights, sample until
``evaluation_duration`` episodes have finished (or env steps have been taken) across them,
and report the episodes' stats. Their batches never leave them.

An evaluation worker that dies (its process killed, its node lost) is counted and replaced
in its slot, as the trainer replaces a rollout worker: the next call that finds it dead
starts a new one from its creation spec, which gets the evaluation's weights and filter
statistics before it samples, and the evaluation goes on to its full duration with the
episodes of the workers that answered. ``num_worker_restarts`` in the ``evaluation``
section counts the replacements of the run.

With a ``video_dir`` (``record_env`` / ``monitor``: see
:meth:`actorrl.config.algorithm.AlgorithmConfig.video_dir`), every evaluation worker's
envs render ``rgb_array`` frames and record each episode to an mp4
(:mod:`actorrl.envs.video`); after each evaluation the videos of the episodes that ended
in it are fetched from the workers (so workers on other nodes need no shared disk) and
written to ``<video_dir>/iteration<N>-worker<W>-env<I>-episode-<K>.mp4``: training
iteration ``N``, evaluation worker ``W``, its env ``I``, that env's ``K``-th episode.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from actorrl.callbacks import summarize_custom_metrics
from actorrl.config.rollout import WorkerConfig
from actorrl.envs import EpisodeMetrics
from actorrl.pipelines.pieces import Fleet, FleetMixin
from actorrl.runtime import ActorHandle, DriverLike, ObjectRef, Runtime

log = logging.getLogger(__name__)

WORKER_CLASS = "actorrl.rollout.actor:RolloutWorkerActor"


class Evaluator(FleetMixin):
    """The evaluation workers of one trainer. Create with :meth:`create`; ``driver``
    (the one that created the workers) restarts those that die (None: a dead worker's
    slot is dropped)."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], *, duration: int,
                 unit: str, driver: DriverLike | None = None,
                 video_dir: Path | None = None) -> None:
        self.runtime = runtime
        self.video_dir = video_dir
        """Where episode videos go (None: the workers record none)."""
        self.driver = driver
        self.worker_fleet = Fleet(workers, self.replace_worker if driver is not None
                                  else None, "evaluation worker")
        self.duration = duration
        self.unit = unit
        self.num_worker_restarts = 0
        self._loaded: tuple[ObjectRef, dict[str, Any] | None] | None = None
        """The weights and filters of the evaluation under way (what a replacement gets)."""

    @classmethod
    async def create(cls, driver: DriverLike, env: str, policy: str,
                     worker_config: WorkerConfig, *, num_workers: int, first_index: int,
                     duration: int, unit: str, num_cpus: float,
                     video_dir: Path | None = None) -> Evaluator:
        """Start ``max(1, num_workers)`` evaluation workers (indices from
        ``first_index``, after the training workers); with ``video_dir`` they record
        their episodes (see the module docstring)."""
        count = max(1, num_workers)
        record = {"record_video": True} if video_dir is not None else {}
        workers = await asyncio.gather(*(
            driver.create_actor(
                WORKER_CLASS, args=(env, policy, worker_config),
                kwargs={"worker_index": first_index + i,
                        "num_workers": first_index + count - 1, **record},
                num_cpus=num_cpus, name=f"evaluation-worker-{i + 1}")
            for i in range(count)))
        return cls(driver.runtime, list(workers), duration=duration, unit=unit, driver=driver,
                   video_dir=video_dir)

    async def replace_worker(self, dead: ActorHandle) -> ActorHandle | None:
        """Start a fresh evaluation worker in place of ``dead`` (same creation spec), with
        the current evaluation's weights and filters loaded (None: it could not be
        started; the evaluation goes on with the others)."""
        assert self.driver is not None
        try:
            new = await self.driver.restart_actor(dead)
        except Exception as exc:  # evaluate with the workers left
            log.error("could not replace evaluation worker %r: %s", dead, exc)
            return None
        self.num_worker_restarts += 1
        if self._loaded is not None:
            weights, filters = self._loaded
            get = self.runtime.get_async
            await get(new.set_weights.remote(weights), timeout_s=120)
            if filters is not None:
                await get(new.sync_filters.remote(filters), timeout_s=60)
        log.warning("replaced evaluation worker %r with %r", dead, new)
        return new

    async def evaluate(self, weights: ObjectRef, filters: dict[str, Any] | None = None,
                       iteration: int = 0) -> dict[str, Any]:
        """Load ``weights`` (and the driver's observation-filter statistics ``filters``,
        replacing what the evaluation workers gathered themselves) and sample until the
        duration is reached; RLlib's episode stats of the evaluation
        (``episode_reward_mean``... ``episodes_this_iter``, ``timesteps_this_iter``,
        ``custom_metrics``), and ``num_worker_restarts`` (evaluation workers replaced so
        far). A worker found dead is replaced (see the module docstring). With a
        ``video_dir`` the episodes' videos are written there, named with ``iteration``."""
        each = self._on_each_worker
        self._loaded = (weights, filters)
        try:
            await each(lambda w: w.set_weights.remote(weights))
            if filters is not None:
                await each(lambda w: w.get_filters.remote(True))
                await each(lambda w: w.sync_filters.remote(filters))
            # Episodes that ended before these weights arrived are not this evaluation's.
            await each(lambda w: w.get_metrics.remote())
            await each(lambda w: w.pop_custom_metrics.remote())
            metrics = EpisodeMetrics()
            custom: list[dict[str, float]] = []
            steps = 0
            while not self._done(metrics, steps):
                steps += sum(await each(lambda w: w.sample_count.remote()))
                for part in await each(lambda w: w.get_metrics.remote()):
                    metrics = EpisodeMetrics.merge([metrics, part])
                for part in await each(lambda w: w.pop_custom_metrics.remote()):
                    custom.extend(part)
            if self.video_dir is not None:
                await self._save_videos(iteration)
        finally:
            self._loaded = None
        return {**metrics.summary(), "timesteps_this_iter": steps,
                "custom_metrics": summarize_custom_metrics(custom),
                "num_worker_restarts": self.num_worker_restarts}

    async def _save_videos(self, iteration: int) -> None:
        """Fetch the workers' finished episode videos and write them to ``video_dir``."""
        assert self.video_dir is not None
        videos = [video for part in await self._on_each_worker(lambda w: w.pop_videos.remote())
                  for video in part]
        if videos:
            await asyncio.to_thread(write_videos, self.video_dir, f"iteration{iteration}-",
                                    videos)

    def _done(self, metrics: EpisodeMetrics, steps: int) -> bool:
        if self.unit == "timesteps":
            return steps >= self.duration
        return metrics.num_episodes >= self.duration

    async def close_recorders(self) -> None:
        """Recording workers close their envs and remove their temporary video folders
        (before they are killed; nothing without a ``video_dir``)."""
        if self.video_dir is not None:
            await asyncio.gather(*(self.runtime.get_async(w.stop.remote(), timeout_s=30)
                                   for w in self.workers), return_exceptions=True)

    async def stop(self, driver: DriverLike) -> None:
        """Stop the evaluation workers (see :meth:`close_recorders`)."""
        await self.close_recorders()
        await asyncio.gather(*(driver.kill_actor(w) for w in self.workers),
                             return_exceptions=True)


def write_videos(folder: Path, prefix: str, videos: list[tuple[str, bytes]]) -> None:
    """Write each ``(name, mp4 bytes)`` to ``folder/<prefix><name>`` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in videos:
        (folder / f"{prefix}{Path(name).name}").write_bytes(data)
