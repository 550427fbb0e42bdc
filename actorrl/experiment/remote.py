"""``actorrl train --address ADDR``: the same training job, run by an existing coordinator.

The job is submitted through :class:`actorrl.client.Client` with the resolved config, its
``"algorithm"`` key and the stop criteria as the job's ``"stop"`` mapping
(``episode_reward_mean``, ``timesteps_total``, ``time_total_s``), so the job ends by itself
even if this command goes away. Results stream back (``job.results()``) into the usual
local results folder; the stop criteria are also checked here. When this command stops the
job (a criterion met locally first, SIGINT, SIGTERM) it asks for a checkpoint
(``job.checkpoint()``) and then calls ``job.stop()``. Checkpoints live on the
coordinator's host; ``run.json`` records their path. No process is started on this machine.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

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

CONNECT_TIMEOUT_S = 10.0


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


def job_submission(plan: TrainPlan) -> dict[str, Any]:
    """The submitted mapping: ``algorithm``, every config key and the ``stop`` criteria."""
    stop: dict[str, float] = {}
    if plan.stop.reward is not None:
        stop["episode_reward_mean"] = plan.stop.reward
    if plan.stop.timesteps is not None:
        stop["timesteps_total"] = plan.stop.timesteps
    if plan.stop.time_s is not None:
        stop["time_total_s"] = plan.stop.time_s
    return {"algorithm": plan.spec.name, **plan.config.to_dict(), "stop": stop}


def run_remote(plan: TrainPlan, address: str, keys_dir: str | None, run_dir: RunDirectory,
               display: ProgressDisplay, client_class: type) -> RunSummary:
    """Submit ``plan`` to the coordinator at ``address`` and follow it to a stop criterion,
    a signal or a failure. Returns the summary (status and exit code set)."""
    summary = RunSummary()
    run_dir.update_status(**summary.as_status(), algorithm=plan.spec.name,
                          env=plan.config.env, address=address, command=list(plan.command),
                          started_at=summary.started_at, stop_criteria=plan.stop.describe())
    writer = ResultWriter(run_dir.path)
    client = job = None
    try:
        client = client_class(address, keys_dir=keys_dir, bind_host=None,
                              connect_timeout_s=CONNECT_TIMEOUT_S)
        job = client.submit(job_submission(plan))
        job_id = str(getattr(job, "id", job))
        run_dir.update_status(job_id=job_id)
        display.note(f"submitted {plan.spec.name} on {plan.config.env} to {address} as job "
                     f"{job_id}; results in {run_dir.path}")
        _follow(job, plan, writer, summary, display)
    except (KeyboardInterrupt, SignalExit) as exc:
        signum = exc.signum if isinstance(exc, SignalExit) else signal.SIGINT
        summary.status, summary.exit_code = STATUS_INTERRUPTED, exit_code_for(signum)
        summary.stop_reason = signal.Signals(signum).name
        if job is not None:
            _checkpoint_and_stop(job, summary)
    except Exception as exc:
        log.error("remote training failed", exc_info=True, extra=FILE_ONLY)
        summary.status, summary.exit_code = STATUS_FAILED, EXIT_FAILED
        summary.error = error_summary(exc)
    finally:
        if client is not None:
            try:
                client.close()
            except Exception as exc:
                log.warning("closing the client: %s", error_summary(exc))
        writer.close()
        summary.wall_time_s = time.time() - summary.started_at
        run_dir.update_status(**summary.as_status(), ended_at=time.time())
    return summary


def _follow(job: Any, plan: TrainPlan, writer: ResultWriter, summary: RunSummary,
            display: ProgressDisplay) -> None:
    started = time.monotonic()
    summary.training_started_at = time.time()
    display.start(f"{plan.spec.name} on {plan.config.env} (job {getattr(job, 'id', job)})",
                  plan.stop)
    try:
        for result in job.results():
            derived = writer.record(result)
            summary.observe(result)
            display.update(result, derived, summary.best_reward)
            reason = plan.stop.reached(result, time.monotonic() - started)
            if reason is not None:
                summary.status, summary.exit_code, summary.stop_reason = (
                    STATUS_FINISHED, 0, reason)
                _checkpoint_and_stop(job, summary)
                return
    finally:
        display.close()
    # The job ended by itself (its own stop criteria): it wrote its final checkpoint.
    record = job.status()
    summary.status, summary.exit_code = STATUS_FINISHED, 0
    summary.stop_reason = record.get("stop_reason") or f"job {record.get('state')}"
    _note_checkpoint(record.get("checkpoint"), summary)


def _checkpoint_and_stop(job: Any, summary: RunSummary) -> None:
    """Checkpoint the job (its path is recorded), then stop it; failures are logged."""
    try:
        _note_checkpoint(job.checkpoint(), summary)
    except Exception as exc:
        log.warning("the job could not checkpoint: %s", error_summary(exc))
    try:
        job.stop()
    except Exception as exc:
        log.warning("stopping the job: %s", error_summary(exc))


def _note_checkpoint(checkpoint: Any, summary: RunSummary) -> None:
    if isinstance(checkpoint, dict) and checkpoint.get("path"):
        summary.last_checkpoint = f"{checkpoint['path']} (on the coordinator's host)"
