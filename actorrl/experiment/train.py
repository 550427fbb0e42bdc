"""``actorrl train``: validate every input, then run one training job to a stop criterion.

:func:`plan_training` checks the algorithm, config file, ``--set`` overrides, env id and
checkpoint before anything starts (bad input raises :class:`UsageError`, exit code 2, and
leaves no folder behind). :class:`TrainingRun` then starts an embedded local cluster (a
:class:`~actorrl.runtime.Driver` in this process; workers, learner and replay shards as
child processes), trains, records every result, checkpoints, and shuts everything down.

Exit codes: 0 a stop criterion was met; 1 training failed (one error line, details in the
logs); 2 bad input; 130 interrupted by SIGINT; 143 interrupted by SIGTERM. On the first
signal the current iteration gets :data:`ITERATION_GRACE_S` to finish, then a final
checkpoint is written, results are flushed and every actor is stopped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from actorrl.algorithms import AlgorithmSpec, Trainer, get_algorithm
from actorrl.config import (
    AlgorithmConfig,
    ConfigError,
    load_config,
    parse_override,
    read_config_file,
)
from actorrl.envs import make_env
from actorrl.experiment.checkpoint import read_checkpoint, write_checkpoint
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.progress import ProgressDisplay
from actorrl.experiment.results import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    ResultWriter,
    RunDirectory,
)
from actorrl.experiment.signals import exit_code_for
from actorrl.experiment.stop import StopCriteria, default_stop_reward
from actorrl.runtime import Driver
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

T = TypeVar("T")

ITERATION_GRACE_S = 5.0
"""After a stop signal, how long the running iteration may take before it is cancelled."""
STATE_TIMEOUT_S = 60.0
"""Deadline for fetching the trainer state for a checkpoint."""
TRAINER_STOP_TIMEOUT_S = 30.0
"""Deadline for stopping the pipeline and actors before the driver kills what is left."""
EXIT_FAILED = 1
FILE_ONLY = {"file_only": True}
"""``extra=`` for log records that belong in driver.log but not on the terminal (the
terminal gets one summarised error line instead)."""


@dataclass(frozen=True)
class TrainPlan:
    """Everything a training run needs, validated."""

    spec: AlgorithmSpec
    config: AlgorithmConfig
    stop: StopCriteria
    output_dir: str
    checkpoint_every: int
    """Iterations between checkpoints (0: only the final one)."""
    restore_from: Path | None = None
    restore_state: dict[str, Any] | None = field(default=None, repr=False)
    debug: bool = False
    command: tuple[str, ...] = ()


def resolve_config(spec: AlgorithmSpec, *, base: dict[str, Any] | None = None,
                   config_file: str | None = None, overrides: Sequence[str] = (),
                   explicit: dict[str, Any] | None = None) -> AlgorithmConfig:
    """The algorithm's config from (lowest precedence first) its defaults, ``base`` (a
    checkpoint's config), ``config_file`` (YAML/JSON), ``overrides`` (``key=value``) and
    ``explicit`` (command-line flags that were given); :class:`UsageError` listing every
    problem otherwise."""
    values: dict[str, Any] = dict(base or {})
    try:
        if config_file is not None:
            file_values = read_config_file(config_file)
            named = file_values.pop("algorithm", None)
            if named is not None and named != spec.name:
                raise UsageError(f"config file {config_file!r} is for algorithm {named!r}, "
                                 f"not {spec.name!r}")
            values.update(file_values)
        for text in overrides:
            key, value = parse_override(text)
            values[key] = value
        values.update({k: v for k, v in (explicit or {}).items() if v is not None})
        return load_config(spec.config_cls, values)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def check_env(config: AlgorithmConfig) -> None:
    """Build and close one env of ``config`` so a bad env id or env_config fails here,
    before any process starts."""
    try:
        env = make_env(config.env, config.env_config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # gymnasium raises many types for bad kwargs or missing deps
        raise UsageError(f"cannot create env {config.env!r}: {error_summary(exc)}") from None
    try:
        env.close()
    except Exception:
        pass


def plan_training(algorithm: str, *, env: str | None = None, num_workers: int | None = None,
                  config_file: str | None = None, overrides: Sequence[str] = (),
                  seed: int | None = None, output_dir: str = "results",
                  checkpoint_every: int = 10, restore: str | None = None,
                  stop_reward: float | None = None, stop_reward_given: bool = False,
                  stop_timesteps: int | None = None, stop_time_s: float | None = None,
                  debug: bool = False, command: Sequence[str] = ()) -> TrainPlan:
    """Validate all inputs of ``actorrl train`` (see the module docstring).

    ``stop_reward_given`` false means "use the env's default" (450 for CartPole-v1);
    ``stop_reward`` None with it true disables the reward criterion.
    """
    try:
        spec = get_algorithm(algorithm)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    restore_from, restore_state, base = None, None, None
    if restore is not None:
        restore_from, restore_state = read_checkpoint(restore)
        if restore_state["algorithm"] != spec.name:
            raise UsageError(f"checkpoint {str(restore_from)!r} is for algorithm "
                             f"{restore_state['algorithm']!r}, not {spec.name!r}")
        base = dict(restore_state.get("config") or {})
    config = resolve_config(spec, base=base, config_file=config_file, overrides=overrides,
                            explicit={"env": env, "num_workers": num_workers, "seed": seed})
    check_env(config)
    if checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    reward = stop_reward if stop_reward_given else default_stop_reward(config.env)
    stop = StopCriteria(reward=reward, timesteps=stop_timesteps,
                        time_s=stop_time_s if stop_time_s else None)
    return TrainPlan(spec=spec, config=config, stop=stop, output_dir=output_dir,
                     checkpoint_every=checkpoint_every, restore_from=restore_from,
                     restore_state=restore_state, debug=debug, command=tuple(command))


@dataclass
class RunSummary:
    """What a run achieved, printed at exit and stored in ``run.json``."""

    status: str = STATUS_RUNNING
    exit_code: int = 0
    stop_reason: str = ""
    error: str = ""
    best_reward: float | None = None
    best_iteration: int | None = None
    timesteps_total: int = 0
    training_iteration: int = 0
    last_reward: float | None = None
    last_checkpoint: str | None = None
    started_at: float = field(default_factory=time.time)
    training_started_at: float | None = None
    wall_time_s: float = 0.0

    def observe(self, result: dict[str, Any]) -> None:
        """Track counters and the best mean reward from one result."""
        self.timesteps_total = int(result.get("timesteps_total", 0))
        self.training_iteration = int(result.get("training_iteration", 0))
        reward = result.get("episode_reward_mean")
        if isinstance(reward, (int, float)) and not math.isnan(reward):
            self.last_reward = float(reward)
            if self.best_reward is None or reward > self.best_reward:
                self.best_reward, self.best_iteration = float(reward), self.training_iteration

    def as_status(self) -> dict[str, Any]:
        """Fields for ``run.json``."""
        return {"status": self.status, "exit_code": self.exit_code,
                "stop_reason": self.stop_reason, "error": self.error,
                "best_reward": self.best_reward, "best_iteration": self.best_iteration,
                "last_reward": self.last_reward, "timesteps_total": self.timesteps_total,
                "training_iteration": self.training_iteration,
                "last_checkpoint": self.last_checkpoint, "wall_time_s": self.wall_time_s}


class _Stopped(Exception):
    """A stop signal arrived before the awaited step finished."""


class TrainingRun:
    """One training job in this process: see the module docstring."""

    def __init__(self, plan: TrainPlan, run_dir: RunDirectory, display: ProgressDisplay
                 ) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.display = display
        self.summary = RunSummary()
        self.stop_signal: int | None = None
        self._stop_requested = asyncio.Event()
        self._main: asyncio.Task | None = None
        self._aborted = False
        self._last_checkpoint_iteration = -1

    # ---- signals ------------------------------------------------------------------------
    def on_signal(self, signum: int, count: int) -> None:
        """First signal: stop after the current iteration (at most ``ITERATION_GRACE_S``),
        checkpoint, shut down. Second: abort at once without a checkpoint."""
        name = signal.Signals(signum).name
        if count == 1:
            self.stop_signal = signum
            self.display.note(f"{name} received: stopping after this iteration and writing a "
                              "checkpoint (again: abort without one)")
            self._stop_requested.set()
        elif count == 2 and self._main is not None and not self._aborted:
            self._aborted = True
            self.display.note(f"{name} received again: aborting; stopping all actors")
            self._main.cancel()

    async def _unless_stopped(self, work: Awaitable[T], grace_s: float = 0.0) -> T:
        """Await ``work``; if a stop is requested first, give it ``grace_s`` more, then
        cancel it and raise :class:`_Stopped`."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and grace_s > 0:
                await asyncio.wait({task}, timeout=grace_s)
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise _Stopped()
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()

    # ---- the run --------------------------------------------------------------------------
    async def run(self) -> RunSummary:
        """Train until a stop criterion, a signal or a failure; always leaves no actor
        running. Returns the summary (status and exit code set)."""
        self._main = asyncio.current_task()
        plan, run_dir = self.plan, self.run_dir
        run_dir.update_status(**self.summary.as_status(), algorithm=plan.spec.name,
                              env=plan.config.env, pid=os.getpid(), command=list(plan.command),
                              started_at=self.summary.started_at,
                              restored_from=str(plan.restore_from) if plan.restore_from
                              else None, stop_criteria=plan.stop.describe())
        writer = ResultWriter(run_dir.path)
        try:
            await self._run_cluster(writer)
        except asyncio.CancelledError:
            if not self._aborted:
                raise
            self._finish(STATUS_INTERRUPTED, self._signal_exit_code(), "aborted by a second "
                         "signal")
        except Exception as exc:
            log.error("training failed", exc_info=True, extra=FILE_ONLY)
            self.summary.error = error_summary(exc)
            self._finish(STATUS_FAILED, EXIT_FAILED, "")
            if plan.debug:
                traceback.print_exc()
        finally:
            writer.close()
            self.summary.wall_time_s = time.time() - self.summary.started_at
            run_dir.update_status(**self.summary.as_status(), ended_at=time.time())
        return self.summary

    def _signal_exit_code(self) -> int:
        return exit_code_for(self.stop_signal or signal.SIGINT)

    def _signal_name(self) -> str:
        return signal.Signals(self.stop_signal or signal.SIGINT).name

    def _finish(self, status: str, exit_code: int, reason: str) -> None:
        self.summary.status, self.summary.exit_code = status, exit_code
        if reason:
            self.summary.stop_reason = reason

    async def _run_cluster(self, writer: ResultWriter) -> None:
        # Sockets live in a short temporary folder (ipc paths are limited to ~107 bytes);
        # actor logs go straight to the results folder through a symlink.
        session_dir = tempfile.mkdtemp(prefix="actorrl-")
        os.symlink(self.run_dir.logs_dir.resolve(), os.path.join(session_dir, "logs"))
        try:
            async with Driver.start(session_dir=session_dir) as driver:
                await self._run_trainer(driver, writer)
        finally:
            shutil.rmtree(session_dir, ignore_errors=True)

    async def _run_trainer(self, driver: Driver, writer: ResultWriter) -> None:
        plan = self.plan
        self.display.note(f"starting {plan.spec.name} on {plan.config.env} "
                          f"(num_workers={plan.config.num_workers}); results in "
                          f"{self.run_dir.path}")
        try:
            trainer = await self._unless_stopped(Trainer.create(plan.spec, plan.config, driver))
        except _Stopped:
            self._finish(STATUS_INTERRUPTED, self._signal_exit_code(),
                         "interrupted while starting")
            return
        try:
            if plan.restore_state is not None:
                await trainer.set_state(plan.restore_state)
                self._last_checkpoint_iteration = trainer.iteration
                self.display.note(f"restored {plan.restore_from} (iteration "
                                  f"{trainer.iteration}, timesteps "
                                  f"{plan.restore_state['timesteps_total']:,})")
            await self._train(trainer, writer)
            if self.summary.status in (STATUS_FINISHED, STATUS_INTERRUPTED):
                await self._checkpoint(trainer, final=True)
        finally:
            if not self._aborted:  # an abort leaves the actors to the driver's shutdown
                try:
                    await wait_for(trainer.stop(), TRAINER_STOP_TIMEOUT_S)
                except Exception as exc:  # the driver's shutdown kills whatever is left
                    log.warning("stopping the trainer: %s", error_summary(exc))

    async def _train(self, trainer: Trainer, writer: ResultWriter) -> None:
        plan = self.plan
        started = time.monotonic()
        self.summary.training_started_at = time.time()
        self.display.start(f"{plan.spec.name} on {plan.config.env}", plan.stop)
        try:
            while True:
                try:
                    result = await self._unless_stopped(trainer.train(), ITERATION_GRACE_S)
                except _Stopped:
                    self._finish(STATUS_INTERRUPTED, self._signal_exit_code(),
                                 f"{self._signal_name()} during iteration "
                                 f"{trainer.iteration + 1}")
                    return
                derived = writer.record(result)
                self.summary.observe(result)
                self.display.update(result, derived, self.summary.best_reward)
                reason = plan.stop.reached(result, time.monotonic() - started)
                if reason is not None:
                    self._finish(STATUS_FINISHED, 0, reason)
                    return
                if self._stop_requested.is_set():
                    self._finish(STATUS_INTERRUPTED, self._signal_exit_code(),
                                 f"{self._signal_name()} after iteration {trainer.iteration}")
                    return
                if plan.checkpoint_every and trainer.iteration % plan.checkpoint_every == 0:
                    await self._checkpoint(trainer, final=False)
        finally:
            self.display.close()

    async def _checkpoint(self, trainer: Trainer, final: bool) -> None:
        if trainer.iteration == self._last_checkpoint_iteration or trainer.iteration == 0:
            return
        state = await wait_for(trainer.get_state(), STATE_TIMEOUT_S)
        metadata = {"algorithm": self.plan.spec.name, "env": self.plan.config.env,
                    "training_iteration": trainer.iteration,
                    "timesteps_total": state["timesteps_total"],
                    "num_steps_trained": state["num_steps_trained"],
                    "episode_reward_mean": self.summary.last_reward,
                    "best_reward": self.summary.best_reward, "final": final}
        path = await asyncio.to_thread(write_checkpoint, self.run_dir.checkpoints_dir, state,
                                       metadata)
        self._last_checkpoint_iteration = trainer.iteration
        self.summary.last_checkpoint = str(path)
        self.run_dir.update_status(last_checkpoint=str(path))
        self.display.note(f"checkpoint {path}")


def format_summary(plan_name: str, env: str, summary: RunSummary, run_dir: Path) -> str:
    """The multi-line report printed when a run ends."""
    best = ("-" if summary.best_reward is None
            else f"{summary.best_reward:.1f} (iteration {summary.best_iteration})")
    status = summary.status + (f": {summary.stop_reason}" if summary.stop_reason else "")
    train_s = (time.time() - summary.training_started_at
               if summary.training_started_at else 0.0)
    lines = [
        f"{plan_name} on {env}: {status}",
        f"  best episode_reward_mean  {best}",
        f"  timesteps_total           {summary.timesteps_total:,}",
        f"  training_iteration        {summary.training_iteration}",
        f"  wall time                 {summary.wall_time_s:.1f} s (training {train_s:.1f} s)",
        f"  results                   {run_dir}",
        f"  last checkpoint           {summary.last_checkpoint or '-'}",
        f"  logs                      {run_dir / 'logs'}",
    ]
    return "\n".join(lines)


def configure_logging(log_file: Path, debug: bool) -> None:
    """Everything to ``log_file``; warnings of actorrl itself (one line each, no
    traceback) to stderr, or everything with tracebacks when ``debug``."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    console = _StderrHandler(debug)
    console.setLevel(logging.DEBUG if debug else logging.WARNING)
    root.addHandler(console)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (the live display redirects it)."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "file_only", False):
            return False
        return self.debug or record.name.startswith(("actorrl", "transport"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.debug:
                text = logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)
            else:
                text = f"{record.levelname.lower()}: {record.getMessage().splitlines()[0]}"
            print(text, file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)
