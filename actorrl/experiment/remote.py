"""``actorrl train --address ADDR``: the same training job, run by an existing coordinator.

The job is submitted through :class:`actorrl.client.Client` (``client.submit(config)`` with
the config's ``"algorithm"`` key, then ``job.results()``, ``job.checkpoint()``,
``job.stop()``). Results are recorded locally in the usual results folder and the stop
criteria are checked here; when one is met (or on SIGINT/SIGTERM) the job is asked for a
checkpoint and stopped. No process is started on this machine.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from actorrl.experiment.checkpoint import write_checkpoint
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.progress import ProgressDisplay
from actorrl.experiment.results import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_INTERRUPTED,
    ResultWriter,
    RunDirectory,
)
from actorrl.experiment.signals import SignalExit, exit_code_for
from actorrl.experiment.train import EXIT_FAILED, FILE_ONLY, RunSummary, TrainPlan

log = logging.getLogger(__name__)


def load_client_class() -> type:
    """``actorrl.client.Client``, imported on demand; :class:`UsageError` when this
    installation has no cluster client."""
    try:
        from actorrl.client import Client
    except ImportError as exc:
        raise UsageError(f"--address needs the cluster client (actorrl.client), which "
                         f"cannot be imported here ({exc}); train locally without "
                         "--address") from None
    return Client


def job_config(plan: TrainPlan) -> dict[str, Any]:
    """The config submitted to the coordinator: the resolved config plus ``algorithm``."""
    return {"algorithm": plan.spec.name, **plan.config.to_dict()}


def run_remote(plan: TrainPlan, address: str, run_dir: RunDirectory,
               display: ProgressDisplay, client_class: type) -> RunSummary:
    """Submit ``plan`` to the coordinator at ``address`` and follow it to a stop criterion,
    a signal or a failure. Returns the summary (status and exit code set)."""
    summary = RunSummary()
    run_dir.update_status(**summary.as_status(), algorithm=plan.spec.name,
                          env=plan.config.env, address=address, command=list(plan.command),
                          started_at=summary.started_at, stop_criteria=plan.stop.describe())
    writer = ResultWriter(run_dir.path)
    job = None
    try:
        job = client_class(address).submit(job_config(plan))
        run_dir.update_status(job=str(getattr(job, "job_id", getattr(job, "id", job))))
        display.note(f"submitted {plan.spec.name} on {plan.config.env} to {address}; "
                     f"results in {run_dir.path}")
        started = time.monotonic()
        summary.training_started_at = time.time()
        display.start(f"{plan.spec.name} on {plan.config.env} @ {address}", plan.stop)
        try:
            for result in job.results():
                derived = writer.record(result)
                summary.observe(result)
                display.update(result, derived, summary.best_reward)
                reason = plan.stop.reached(result, time.monotonic() - started)
                if reason is not None:
                    summary.status, summary.exit_code, summary.stop_reason = (
                        STATUS_FINISHED, 0, reason)
                    break
            else:
                summary.status, summary.exit_code = STATUS_FINISHED, 0
                summary.stop_reason = "the job ended"
        finally:
            display.close()
        _final_checkpoint(job, run_dir, summary, plan)
    except (KeyboardInterrupt, SignalExit) as exc:
        signum = exc.signum if isinstance(exc, SignalExit) else signal.SIGINT
        summary.status, summary.exit_code = STATUS_INTERRUPTED, exit_code_for(signum)
        summary.stop_reason = signal.Signals(signum).name
        if job is not None:
            _final_checkpoint(job, run_dir, summary, plan)
    except Exception as exc:
        log.error("remote training failed", exc_info=True, extra=FILE_ONLY)
        summary.status, summary.exit_code = STATUS_FAILED, EXIT_FAILED
        summary.error = error_summary(exc)
    finally:
        if job is not None:
            try:
                job.stop()
            except Exception as exc:
                log.warning("stopping job: %s", error_summary(exc))
        writer.close()
        summary.wall_time_s = time.time() - summary.started_at
        run_dir.update_status(**summary.as_status(), ended_at=time.time())
    return summary


def _final_checkpoint(job: Any, run_dir: RunDirectory, summary: RunSummary,
                      plan: TrainPlan) -> None:
    """Ask the job for a checkpoint: a trainer state is written locally, a path on the
    coordinator's side is recorded."""
    try:
        checkpoint = job.checkpoint()
    except Exception as exc:
        log.warning("the job could not checkpoint: %s", error_summary(exc))
        return
    if isinstance(checkpoint, dict) and "policies" in checkpoint:
        metadata = {"algorithm": plan.spec.name, "env": plan.config.env,
                    "training_iteration": checkpoint.get("iteration"),
                    "timesteps_total": checkpoint.get("timesteps_total"),
                    "episode_reward_mean": summary.last_reward, "final": True}
        path = write_checkpoint(run_dir.checkpoints_dir, checkpoint, metadata)
        summary.last_checkpoint = str(path)
    elif checkpoint is not None:
        summary.last_checkpoint = f"{checkpoint} (on the coordinator)"
