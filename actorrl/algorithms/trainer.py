"""The trainer: builds an algorithm's actors, runs its pipeline, reports RLlib results.

All wiring for a job lives here: which actors exist (rollout workers, the learner, replay
shards via the pipeline), where they run, how a failed worker is replaced, and what one
training iteration's result dict holds.

When an actor the pipeline cannot replace dies (the learner), the trainer is rebuilt
(:mod:`actorrl.experiment.recovery`); :meth:`Trainer.salvage` hands the next trainer the
actors of the failed one that still answer (:class:`Survivors`: rollout workers and replay
shards, with their contents), so the restart replaces only what died.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from actorrl.algorithms.evaluation import Evaluator
from actorrl.callbacks import CustomMetricsWindow, DefaultCallbacks, make_callbacks
from actorrl.config.algorithm import AlgorithmConfig
from actorrl.envs import EpisodeMetrics, EpisodeWindow
from actorrl.envs.filters import MEAN_STD_FILTER, FilterManager
from actorrl.learner.config import LearnerConfig
from actorrl.runtime import ActorDiedError, ActorHandle, DriverLike, Runtime
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

SALVAGE_PING_TIMEOUT_S = 10.0
"""How long a surviving actor has to answer before a restart counts it dead."""
SALVAGE_STOP_TIMEOUT_S = 30.0
"""Deadline for stopping a failed trainer's pipeline before its actors are sorted."""
NO_WORKERS_POLL_S = 5.0
"""How often a trainer without rollout workers looks again while replacements start."""

WORKER_CLASS = "actorrl.rollout.actor:RolloutWorkerActor"
LEARNER_CLASS = "actorrl.learner.actor:LearnerActor"


class Survivors:
    """Live actors of a failed trainer that the next trainer takes over, by actor name
    (``worker-<i>``, ``replay-<i>``): :meth:`Trainer.create` takes the ones it needs in
    place of starting new ones and stops the rest."""

    def __init__(self, driver: DriverLike, actors: Mapping[str, ActorHandle]) -> None:
        self.driver = driver
        self.actors = dict(actors)
        """Not yet taken, by name."""
        self.taken: list[ActorHandle] = []

    def __len__(self) -> int:
        return len(self.actors)

    def take(self, name: str) -> ActorHandle | None:
        """The live actor named ``name`` (None: none survived), now the caller's."""
        actor = self.actors.pop(name, None)
        if actor is not None:
            self.taken.append(actor)
        return actor

    async def release(self) -> None:
        """Stop the actors nobody took."""
        actors, self.actors = list(self.actors.values()), {}
        await asyncio.gather(*(self.driver.kill_actor(a) for a in actors),
                             return_exceptions=True)


class Pipeline(Protocol):
    """What every pipeline exposes to the trainer (RLlib's PolicyOptimizer surface)."""

    workers: list[ActorHandle]

    @property
    def num_steps_sampled(self) -> int: ...

    @property
    def num_steps_trained(self) -> int: ...

    async def step(self) -> Any: ...

    async def stats(self) -> dict[str, Any]: ...

    async def stop(self) -> None: ...

    def reset(self, workers: list[ActorHandle]) -> None: ...


def learner_section(config: Any) -> LearnerConfig:
    """The config's ``learner`` section with its derived values filled (the learner
    settings of an algorithm that has that section)."""
    return config.component("learner")


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm: its config class, policy class path, and how to build its pipeline."""

    name: str
    config_cls: type[AlgorithmConfig]
    policy: str
    pipeline: Callable[[Trainer, Any], Pipeline | Awaitable[Pipeline]]
    """``pipeline(trainer, config)``: the pipeline over the trainer's runtime, workers and
    learner, ``config`` being the trainer's config (an instance of ``config_cls``)."""
    learner_config: Callable[[Any], LearnerConfig] | None = learner_section
    """Learner settings from the config; None: the algorithm has no learner process."""
    learner_thread: bool = True
    """Whether the learner learns from an in-queue in its own thread (Ape-X, IMPALA) or
    only applies gradients it is handed (A3C, A2C)."""
    worker_class: str = WORKER_CLASS
    """Class path of the rollout worker actor (another class with the same methods can
    stand in, e.g. simulated workers that measure the runtime at scale)."""
    learner_class: str = LEARNER_CLASS
    """Class path of the learner actor."""

    async def build_pipeline(self, trainer: Trainer) -> Pipeline:
        """The pipeline for ``trainer``, once its workers and learner are up."""
        if not isinstance(trainer.config, self.config_cls):
            raise TypeError(f"{self.name} needs a {self.config_cls.__name__}, got "
                            f"{type(trainer.config).__name__}")
        built = self.pipeline(trainer, trainer.config)
        return await built if inspect.isawaitable(built) else built


class Trainer:
    """Runs one algorithm on a driver's actors (a :class:`~actorrl.runtime.DriverLike`: a
    local, serial or cluster driver). Create with :meth:`create`."""

    def __init__(self, spec: AlgorithmSpec, config: AlgorithmConfig, driver: DriverLike,
                 results_dir: str | os.PathLike[str] | None = None) -> None:
        self.spec = spec
        self.video_dir = config.video_dir(results_dir)
        """Where evaluation episodes' videos go (``record_env``; None: not recorded)."""
        self.config = config
        self.driver = driver
        self.runtime: Runtime = driver.runtime
        self.workers: list[ActorHandle] = []
        self.learner: ActorHandle | None = None
        self.pipeline: Pipeline | None = None
        self.episodes = EpisodeWindow(config.metrics_smoothing_episodes)
        self.iteration = 0
        self.time_total_s = 0.0
        self.timesteps_offset = 0
        self.trained_offset = 0
        self.worker_config = config.worker_config()
        self.num_worker_restarts = 0
        self.learner_side_actors: list[ActorHandle] = []
        self.survivors: Survivors | None = None
        """Live actors of a failed trainer to take over while this one starts."""
        self.reused: list[ActorHandle] = []
        """The actors taken over from :attr:`survivors` (kept with their state)."""
        policy = config.policy
        self._has_schedules = bool(getattr(policy, "lr_schedule", None)
                                   or getattr(policy, "entropy_coeff_schedule", None))
        self._timestep_sent: int | None = None
        self.callbacks = make_callbacks(config.callbacks)
        self._with_callbacks = type(self.callbacks) is not DefaultCallbacks
        self.custom_metrics = CustomMetricsWindow(config.metrics_smoothing_episodes)
        self.evaluator: Evaluator | None = None
        self.filter_manager: FilterManager | None = (
            FilterManager() if config.rollout.observation_filter == MEAN_STD_FILTER else None)
        """The master observation filter (``observation_filter: MeanStdFilter``)."""

    @property
    def learner_actor(self) -> ActorHandle:
        """The learner actor, for building pipelines (an error before it is up)."""
        if self.learner is None:
            raise RuntimeError(f"{self.spec.name} has no learner actor (yet)")
        return self.learner

    @classmethod
    async def create(cls, spec: AlgorithmSpec, config: AlgorithmConfig, driver: DriverLike,
                     results_dir: str | os.PathLike[str] | None = None, *,
                     survivors: Survivors | None = None) -> Trainer:
        """Start the workers and the learner, sync their weights, build the pipeline.
        ``results_dir``: the run's results folder, under which ``record_env`` writes
        evaluation videos (:meth:`AlgorithmConfig.video_dir`). ``survivors``: live
        rollout workers and replay shards of a failed trainer of the same config
        (:meth:`salvage`), used in place of new ones (the rest are stopped). If starting
        fails, what it started or took is stopped."""
        trainer = cls(spec, config, driver, results_dir)
        trainer.survivors = survivors
        try:
            await trainer._setup()
        except BaseException:
            await trainer._kill_all()
            raise
        finally:
            trainer.survivors = None
            if survivors is not None:
                await survivors.release()
        return trainer

    async def salvage(self) -> Survivors:
        """For a restart after an actor died: stop the pipeline, stop the learner and the
        evaluation workers, and hand over the rollout workers and learner-side actors
        (replay shards) that still answer, with their state (a dead or silent one is
        stopped). This trainer holds no actor afterwards."""
        if self.pipeline is not None:
            try:
                await wait_for(self.pipeline.stop(), SALVAGE_STOP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the learner is likely dead
                log.debug("stopping the failed pipeline: %s", exc)
        candidates = [*self.workers, *self.learner_side_actors]
        answers = await asyncio.gather(*(self._answers(a) for a in candidates))
        alive = {a.name: a for a, ok in zip(candidates, answers) if ok and a.name}
        survivors = Survivors(self.driver, alive)
        self.workers = [w for w in self.workers if w not in alive.values()]
        self.learner_side_actors = [a for a in self.learner_side_actors
                                    if a not in alive.values()]
        await self._kill_all()
        return survivors

    async def _answers(self, actor: ActorHandle) -> bool:
        """Whether ``actor`` is alive and answers its ``ping`` in time."""
        try:
            await self.runtime.get_async(actor.ping.remote(), timeout_s=SALVAGE_PING_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - dead, hung or without ping: replaced
            log.debug("%r does not answer (%s): replaced", actor, exc)
            return False
        return True

    async def _kill_all(self) -> None:
        """Stop every actor this trainer holds (no pipeline call); it holds none after."""
        actors = [*self.workers, *([self.learner] if self.learner else []),
                  *self.learner_side_actors]
        if self.evaluator is not None:
            actors += self.evaluator.workers
        if self.survivors is not None:
            actors += [a for a in self.survivors.taken if a not in actors]
            self.survivors.taken = []
        self.workers, self.learner, self.learner_side_actors = [], None, []
        await asyncio.gather(*(self.driver.kill_actor(a) for a in actors),
                             return_exceptions=True)

    async def _setup(self) -> None:
        config = self.config
        starts = [self._start_worker(i) for i in range(1, config.num_workers + 1)]
        if self.spec.learner_config is not None:
            starts.append(self._start_learner())
        started = await asyncio.gather(*starts)
        self.workers = list(started[: config.num_workers])
        if self.spec.learner_config is not None:
            self.learner = started[-1]
            await self.broadcast_learner_weights()
        if config.evaluation_interval:
            self.evaluator = await Evaluator.create(
                self.driver, config.env, self.spec.policy,
                config.evaluation_worker_config(),
                num_workers=config.evaluation_num_workers,
                first_index=config.num_workers + 1, duration=config.evaluation_duration,
                unit=config.evaluation_duration_unit, num_cpus=config.num_cpus_per_worker,
                video_dir=self.video_dir)
        self.pipeline = await self.spec.build_pipeline(self)

    def _take_survivor(self, name: str) -> ActorHandle | None:
        actor = self.survivors.take(name) if self.survivors is not None else None
        if actor is not None:
            self.reused.append(actor)
        return actor

    async def _start_worker(self, index: int) -> ActorHandle:
        kept = self._take_survivor(f"worker-{index}")
        if kept is not None:
            return kept
        return await self.driver.create_actor(
            self.spec.worker_class,
            args=(self.config.env, self.spec.policy, self.worker_config),
            kwargs={"worker_index": index, "num_workers": self.config.num_workers},
            num_cpus=self.config.num_cpus_per_worker, name=f"worker-{index}")

    async def _start_learner(self) -> ActorHandle:
        assert self.spec.learner_config is not None
        learner_config = self.spec.learner_config(self.config)
        num_gpus = 0.0 if self.config._fake_gpus else float(self.config.num_gpus)
        node_gpus = self.driver.local_gpus
        if num_gpus == 0 and not self.config._fake_gpus and node_gpus >= 1:
            num_gpus = 1.0  # the learner uses CUDA when the machine has it
        return await self.driver.create_actor(
            self.spec.learner_class,
            args=(self.config.env, self.spec.policy, self.worker_config,
                  learner_config),
            kwargs={"start_thread": self.spec.learner_thread,
                    "sampling": self.config.num_workers == 0},
            num_cpus=self.config.num_cpus_for_driver, num_gpus=num_gpus, name="learner")

    async def broadcast_learner_weights(self, workers: list[ActorHandle] | None = None
                                        ) -> None:
        """Give ``workers`` (default: all) the learner's current weights and the run's
        env-step count (``timesteps_total``, restored steps included), which their
        schedules (epsilon, lr) follow, as the pipelines' own broadcasts do."""
        assert self.learner is not None
        weights = self.learner.get_weights.remote()
        timestep = (self.counters()["timesteps_total"] if self.pipeline is not None
                    else self.timesteps_offset)
        targets = self.workers if workers is None else workers
        await self.runtime.get_async(
            [w.set_weights.remote(weights, timestep) for w in targets], timeout_s=120)

    async def create_learner_side_actors(self, class_path: str, args: tuple, count: int,
                                         name: str, kwargs: dict[str, Any] | None = None
                                         ) -> list[ActorHandle]:
        """Start ``count`` actors on the learner's node (replay shards), zero CPUs each as
        in RLlib, so they never block placement; a live one of a failed trainer with the
        same name (:attr:`survivors`) is kept instead, with its contents."""
        async def start(i: int) -> ActorHandle:
            kept = self._take_survivor(f"{name}-{i}")
            if kept is not None:
                return kept
            return await self.driver.create_actor(
                class_path, args=args, kwargs={**(kwargs or {}), "seed": i}, num_cpus=0,
                name=f"{name}-{i}")

        self.learner_side_actors = list(await asyncio.gather(*(start(i)
                                                               for i in range(count))))
        return list(self.learner_side_actors)

    async def replace_learner_side_actor(self, dead: ActorHandle) -> ActorHandle | None:
        """Start a fresh actor (e.g. an empty replay shard) in place of ``dead``."""
        if dead not in self.learner_side_actors:
            return None
        try:
            new = await self.driver.restart_actor(dead)
        except Exception as exc:
            log.error("could not replace %r: %s", dead, exc)
            return None
        self.learner_side_actors = [new if a == dead else a for a in self.learner_side_actors]
        log.debug("replaced %r with %r", dead, new)  # the pipeline logs it
        return new

    async def replace_worker(self, dead: ActorHandle) -> ActorHandle | None:
        """Start a fresh worker in place of ``dead`` (same index), synced to the learner.
        A worker that was already replaced is not replaced again (None). A start that
        fails raises: the pipeline's :class:`~actorrl.pipelines.pieces.Fleet` tries again
        after a backoff."""
        if dead not in self.workers:
            return None
        new = await self.driver.restart_actor(dead)
        self.num_worker_restarts += 1
        self.workers = [new if w == dead else w for w in self.workers]
        if self.learner is not None:
            await self.broadcast_learner_weights([new])
        await self._send_filters([new])
        log.debug("replaced rollout worker %r with %r", dead, new)  # the pipeline logs it
        return new

    # ---- iterations ---------------------------------------------------------------------
    async def train(self) -> dict[str, Any]:
        """Run pipeline steps for at least ``min_iter_time_s`` and
        ``timesteps_per_iteration`` env steps; return one result dict."""
        assert self.pipeline is not None
        config = self.config
        start = time.perf_counter()
        sampled_before = self.pipeline.num_steps_sampled
        while True:
            await self.pipeline.step()
            await self._while_no_workers()
            self._send_global_timestep()
            elapsed = time.perf_counter() - start
            sampled = self.pipeline.num_steps_sampled - sampled_before
            if elapsed >= config.min_iter_time_s and sampled >= config.timesteps_per_iteration:
                break
        episodes = await self._collect_metrics()
        custom = await self._collect_custom_metrics()
        await self.sync_filters()
        time_this_iter = time.perf_counter() - start
        self.iteration += 1
        self.time_total_s += time_this_iter
        info = await self.pipeline.stats()
        info["num_worker_restarts"] = self.num_worker_restarts
        result = {
            **self.episodes.update(episodes),
            "custom_metrics": self.custom_metrics.update(custom),
            **self.counters(),
            "timesteps_this_iter": self.pipeline.num_steps_sampled - sampled_before,
            "time_this_iter_s": time_this_iter,
            "num_healthy_workers": len(self.pipeline.workers),
            "timestamp": time.time(),
            "info": info,
        }
        interval = config.evaluation_interval
        if self.evaluator is not None and interval and self.iteration % interval == 0:
            result["evaluation"] = await self.evaluate()
        self.callbacks.on_train_result(algorithm=self, trainer=self, result=result)
        return result

    async def _while_no_workers(self) -> None:
        """With every rollout worker dead, wait while their replacements are being started
        (bounded: each gives up after its tries, logged), then fail naming the cause
        (:class:`~actorrl.pipelines.pieces.NoWorkersError`) if none came up. Without this
        an iteration that needs ``timesteps_per_iteration`` env steps waited forever."""
        fleet = getattr(self.pipeline, "worker_fleet", None)
        if fleet is None or self.config.num_workers == 0 or len(fleet):
            return
        logged = False
        while not len(fleet) and fleet.replacing:
            if not logged:
                log.warning("no %s left; waiting for %d replacement(s) to start",
                            fleet.role, fleet.replacing)
                logged = True
            await fleet.wait_changed(NO_WORKERS_POLL_S)
        fleet.require()

    async def evaluate(self) -> dict[str, Any]:
        """Evaluate the learner's current weights on the evaluation workers (see
        :mod:`actorrl.algorithms.evaluation`); the result's ``evaluation`` section."""
        assert self.evaluator is not None and self.learner is not None
        return await self.evaluator.evaluate(self.learner.get_weights.remote(),
                                             self._filters_payload(), self.iteration)

    # ---- observation filters ------------------------------------------------------------
    async def sync_filters(self) -> None:
        """RLlib's ``FilterManager.synchronize``: merge every worker's observation-filter
        delta (flushing it) into the master filter, then send the master statistics to
        every worker. Nothing without a MeanStdFilter."""
        if self.filter_manager is None:
            return
        workers = self._samplers()
        results = await asyncio.gather(
            *(self.runtime.get_async(w.get_filters.remote(True), timeout_s=60)
              for w in workers), return_exceptions=True)
        deltas = []
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                log.warning("could not collect observation filters from %r: %s", worker,
                            result)
            elif isinstance(result, BaseException):
                raise result
            else:
                deltas.append(result)
        self.filter_manager.apply_deltas(deltas)
        await self._send_filters(workers)

    def _filters_payload(self) -> dict[str, Any] | None:
        return None if self.filter_manager is None else self.filter_manager.states

    async def _send_filters(self, workers: list[ActorHandle]) -> None:
        payload = self._filters_payload()
        if payload is None:
            return
        results = await asyncio.gather(
            *(self.runtime.get_async(w.sync_filters.remote(payload), timeout_s=60)
              for w in workers), return_exceptions=True)
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                log.warning("could not sync observation filters to %r: %s", worker, result)
            elif isinstance(result, BaseException):
                raise result

    def _send_global_timestep(self) -> None:
        """Tell the learner the global env-step count (``timesteps_total``, restored
        steps included) at most once per train batch of new steps, so it applies
        ``lr_schedule`` / ``entropy_coeff_schedule`` (RLlib's global vars update). Only
        when the config has a schedule."""
        if not self._has_schedules or self.learner is None:
            return
        timestep = self.counters()["timesteps_total"]
        if self._timestep_sent is not None and \
                timestep - self._timestep_sent < self.config.train_batch_size:
            return
        self._timestep_sent = timestep
        self.learner.set_global_timestep.remote(timestep)

    async def _collect_custom_metrics(self) -> list[dict[str, float]]:
        """The workers' episodes' ``custom_metrics`` since the last call (only with
        callbacks: without them there are none)."""
        if not self._with_callbacks:
            return []
        workers = self._samplers()
        results = await asyncio.gather(
            *(self.runtime.get_async(w.pop_custom_metrics.remote(), timeout_s=60)
              for w in workers), return_exceptions=True)
        out: list[dict[str, float]] = []
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                log.warning("could not collect custom metrics from %r: %s", worker, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                out.extend(result)
        return out

    def _samplers(self) -> list[ActorHandle]:
        """The actors that sample, where episode metrics, custom metrics and observation
        filters come from: the pipeline's live rollout workers or, with ``num_workers:
        0``, the learner (its local worker samples)."""
        assert self.pipeline is not None
        workers = list(self.pipeline.workers)
        if not workers and self.learner is not None and self.config.num_workers == 0:
            return [self.learner]
        return workers

    def _reporting_workers(self) -> list[ActorHandle]:
        """The workers whose episodes a result reports: all of them, except with Ape-X's
        per-worker exploration (epsilons or noise scales falling with the worker index),
        where RLlib reports the last third by index, the ones that explore least."""
        policy = getattr(self.config, "policy", None)
        if not getattr(policy, "per_worker", False) or len(self.workers) < 2:
            return list(self.workers)
        return self.workers[(-len(self.workers)) // 3:]  # the last ceil(n / 3)

    async def _collect_metrics(self) -> EpisodeMetrics:
        workers = self._samplers()
        refs = [w.get_metrics.remote() for w in workers]
        results = await asyncio.gather(
            *(self.runtime.get_async(r, timeout_s=60) for r in refs), return_exceptions=True)
        reporting = self._reporting_workers()
        # Every worker's episodes are taken (none pile up); only the reporting ones count.
        metrics = [r for w, r in zip(workers, results)
                   if isinstance(r, EpisodeMetrics) and (w in reporting or w == self.learner)]
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                log.warning("could not collect metrics from %r: %s", worker, result)
            elif isinstance(result, BaseException):
                raise result
        return EpisodeMetrics.merge(metrics)

    # ---- state --------------------------------------------------------------------------
    async def get_state(self) -> dict[str, Any]:
        """Everything a checkpoint needs: policy states (weights + optimizer), counters."""
        source = self.learner if self.learner is not None else self.workers[0]
        assert self.pipeline is not None
        policies = await self.runtime.get_async(source.get_state.remote(), timeout_s=120)
        if self.learner is not None:
            policies = policies["policies"]
        counters = self.counters()
        return {
            "algorithm": self.spec.name,
            "config": self.config.to_dict(),
            "policies": policies,
            "iteration": self.iteration,
            "time_total_s": self.time_total_s,
            "timesteps_total": counters["timesteps_total"],
            "num_steps_trained": counters["num_steps_trained"],
            "filters": self._filters_payload() or {},
        }

    async def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output; counters continue from the checkpoint."""
        if state.get("algorithm") != self.spec.name:
            raise ValueError(f"checkpoint is for {state.get('algorithm')!r}, not "
                             f"{self.spec.name!r}")
        targets = [self.learner] if self.learner is not None else list(self.workers)
        payload = ({"policies": state["policies"], "version": 0}
                   if self.learner is not None else state["policies"])
        await self.runtime.get_async([t.set_state.remote(payload) for t in targets],
                                     timeout_s=120)
        # Counters first: the broadcast tells the workers the restored run's env steps.
        self._set_counters(iteration=int(state["iteration"]),
                           time_total_s=float(state["time_total_s"]),
                           timesteps_total=int(state["timesteps_total"]),
                           num_steps_trained=int(state["num_steps_trained"]))
        if self.learner is not None:
            await self.broadcast_learner_weights()
        if self.filter_manager is not None:
            self.filter_manager.restore(state.get("filters"))
            await self._send_filters(self._samplers())

    # ---- counters -----------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """The run's counters as result keys: ``training_iteration``, ``timesteps_total``,
        ``num_steps_trained`` and ``time_total_s`` (including what a restored checkpoint or
        an earlier attempt had done)."""
        assert self.pipeline is not None
        return {"training_iteration": self.iteration,
                "timesteps_total": self.pipeline.num_steps_sampled + self.timesteps_offset,
                "num_steps_trained": self.pipeline.num_steps_trained + self.trained_offset,
                "time_total_s": self.time_total_s}

    def _set_counters(self, *, iteration: int, time_total_s: float, timesteps_total: int,
                      num_steps_trained: int) -> None:
        assert self.pipeline is not None
        self.iteration = iteration
        self.time_total_s = time_total_s
        self.timesteps_offset = timesteps_total - self.pipeline.num_steps_sampled
        self.trained_offset = num_steps_trained - self.pipeline.num_steps_trained
        counters = getattr(self.pipeline, "counters", None)
        if counters is not None:  # workers' schedules follow the run's steps, not this one's
            counters.sampled_offset = self.timesteps_offset

    async def stop(self) -> None:
        """Stop the pipeline and every actor of this job."""
        if self.pipeline is not None:
            await self.pipeline.stop()
        actors = [*self.workers, *([self.learner] if self.learner else [])]
        actors += self.learner_side_actors
        if self.evaluator is not None:
            await self.evaluator.close_recorders()
            actors += self.evaluator.workers
        await asyncio.gather(*(self.driver.kill_actor(a) for a in actors),
                             return_exceptions=True)
