"""``actorrl train --address ADDR``: the same training job, run by an existing coordinator.

The job is submitted through :class:`actorrl.cluster.client.Client` with the resolved config, its
``"algorithm"`` key and the stop criteria as the job's ``"stop"`` mapping
(:meth:`~actorrl.algorithms.stop.StopCriteria.to_mapping`: ``episode_reward_mean``,
``timesteps_total``, ``time_total_s``), so the job ends by itself even if this command goes
away. Results stream back (``job.results()``) through the same run loop as a local run
(:func:`~actorrl.algorithms.run_loop.run_trainer`, with the job as its trainable) into the
usual local results folder; the stop criteria are also checked here. When this command
stops the job (a criterion met locally first, SIGINT, SIGTERM) it asks for a checkpoint
(``job.checkpoint()``) and then calls ``job.stop()``. Checkpoints live on the
coordinator's host; ``run.json`` records their path. No process is started on this machine.

The coordinator is contacted first (:func:`connect_client`); only once it answered is the
results folder created, so an unreachable coordinator or refused keys leave nothing behind.

The client is synchronous; its calls run in worker threads so the event loop (and the
signal handling on it) stays responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from actorrl.algorithms.run_loop import ENDED, CheckpointPolicy
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.progress import ProgressDisplay
from actorrl.experiment.results import STATUS_FINISHED, RunDirectory
from actorrl.experiment.train import TrainingRun, TrainPlan

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


def load_client_class() -> type:
    """``actorrl.cluster.client.Client``, imported on demand; :class:`UsageError` when this
    installation has no cluster client."""
    try:
        from actorrl.cluster.client import Client
    except ImportError as exc:
        raise UsageError(f"--address needs the cluster client (actorrl.cluster.client), which "
                         f"cannot be imported here ({exc}); train locally without "
                         "--address") from None
    return Client


def job_submission(plan: TrainPlan) -> dict[str, Any]:
    """The submitted mapping: ``algorithm``, every config key and the ``stop`` criteria."""
    return {"algorithm": plan.spec.name, **plan.config.to_dict(),
            "stop": plan.stop.to_mapping()}


def connect_client(client_class: type, address: str, keys_dir: str | None) -> Any:
    """A client of the coordinator at ``address``, its first contact made (the client's
    constructor says hello). Its failure (unreachable, keys refused) propagates with a
    message naming ``address``."""
    try:
        return client_class(address, keys_dir=keys_dir, bind_host=None,
                            connect_timeout_s=CONNECT_TIMEOUT_S)
    except ConnectionError:
        raise
    except OSError as exc:  # e.g. a name that does not resolve: say which address
        raise ConnectionError(f"cannot reach the coordinator at {address}: "
                              f"{exc.strerror or exc}") from None


class FollowedJob:
    """A submitted job as a :class:`~actorrl.algorithms.run_loop.Trainable`: each
    :meth:`train` is the job's next streamed result."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.iteration = 0
        self._results: Iterator[dict[str, Any]] = iter(job.results())

    async def train(self) -> dict[str, Any] | None:
        """The next result (None once the job ended by itself)."""
        result = await asyncio.to_thread(next, self._results, None)
        if result is not None:
            self.iteration = int(result.get("training_iteration", self.iteration + 1))
        return result


class RemoteRun(TrainingRun):
    """A training run submitted to the coordinator at ``address`` and followed here,
    through ``client`` (connected by :func:`connect_client`; the run closes it)."""

    def __init__(self, plan: TrainPlan, run_dir: RunDirectory, display: ProgressDisplay,
                 *, address: str, client: Any) -> None:
        super().__init__(plan, run_dir, display)
        self.address = address
        self.client = client

    def status_fields(self) -> dict[str, Any]:
        """The coordinator's address."""
        return {"address": self.address}

    async def _execute(self) -> None:
        client = self.client
        try:
            await self._follow(client)
        finally:
            try:
                await asyncio.to_thread(client.close)
            except Exception as exc:
                log.warning("closing the client: %s", error_summary(exc))

    async def _follow(self, client: Any) -> None:
        plan = self.plan
        job = await asyncio.to_thread(client.submit, job_submission(plan))
        job_id = str(getattr(job, "id", job))
        self.run_dir.update_status(job_id=job_id)
        self.display.note(f"submitted {plan.spec.name} on {plan.config.env} to "
                          f"{self.address} as job {job_id}; results in {self.run_dir.path}")

        async def checkpoint(final: bool) -> None:
            try:
                self._note_remote_checkpoint(await asyncio.to_thread(job.checkpoint))
            except Exception as exc:
                log.warning("the job could not checkpoint: %s", error_summary(exc))
                with contextlib.suppress(Exception):  # the job's own last one, if any
                    record = await asyncio.to_thread(job.status)
                    self._note_remote_checkpoint(record.get("checkpoint"))

        outcome = await self._train(FollowedJob(job), f"{plan.spec.name} on "
                                    f"{plan.config.env} (job {job_id})",
                                    CheckpointPolicy(save=checkpoint), grace_s=0.0)
        if outcome.status == ENDED:
            # The job ended by itself (its own stop criteria): it wrote its final checkpoint.
            record = await asyncio.to_thread(job.status)
            self._finish(STATUS_FINISHED, 0, record.get("stop_reason")
                         or f"job {record.get('state')}")
            self._note_remote_checkpoint(record.get("checkpoint"))
            return
        try:
            await asyncio.to_thread(job.stop)
        except Exception as exc:
            log.warning("stopping the job: %s", error_summary(exc))

    def _note_remote_checkpoint(self, checkpoint: Any) -> None:
        if isinstance(checkpoint, dict) and checkpoint.get("path"):
            self._note_checkpoint(f"{checkpoint['path']} (on the coordinator's host)")
