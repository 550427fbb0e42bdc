"""Jobs on a cluster: one Trainer per job, results streamed to clients, per-job logs and
checkpoints, and recovery from actor, node and coordinator failures.

A submission is a mapping::

    {"algorithm": "apex",            # any name get_algorithm() knows
     "env": "CartPole-v1", ...,      # the algorithm's config keys (RLlib names)
     "stop": {"training_iteration": 20, "episode_reward_mean": 450},   # any reached: done
     "job": {"name": "...", "checkpoint_interval_s": 10, "max_failures": 20,
             "failure_window_s": 3600, "placement": {"learner": "gpu-box"}}}  # optional

Each job has a directory ``STATE_DIR/jobs/JOB_ID`` with ``job.json`` (its record),
``result.jsonl`` (every result), ``job.log`` (coordinator-side events: placement, deaths,
replacements, restarts) and ``checkpoints/checkpoint_NNNNNN/`` folders in the format of
:mod:`actorrl.algorithms.checkpoints` (wire codec, no pickle), so ``actorrl evaluate`` reads
them.

Recovery, in the order it is tried:

- a dead rollout worker is replaced by the pipeline itself (Trainer.replace_worker), on
  any node with room; the job does not notice beyond ``num_worker_restarts``;
- anything the pipeline cannot survive (the learner or a replay shard died, a node holding
  them was lost) fails the iteration: the job's actors are stopped and the job restarts
  from its last checkpoint after a backoff (1 s, doubling per failure in the window, at
  most 60 s), as long as at most ``max_failures`` failures fall within the last
  ``failure_window_s`` seconds (:mod:`actorrl.algorithms.restarts`; the window survives a
  coordinator restart). Counters (iteration, timesteps, trained steps, time) continue
  from the *checkpoint's*: the iterations after it are done again, and the rows already
  written for them are superseded, never rewritten (every later result carries
  ``info.num_restarts``, ``info.restored_iteration``, ``info.timesteps_lost`` and
  ``info.timesteps_sampled_all``: :class:`~actorrl.algorithms.restarts.Rollbacks`;
  ``actorrl plot``, the run summary, TensorBoard and the trackers of ``actorrl train
  --address`` leave the superseded rows out). The failure counters of ``info``
  (``num_worker_restarts``, ...) continue across restarts; what was learned since the
  checkpoint and the replay contents are lost, and the job log says so;
- a restarted coordinator resumes every job that was running from its checkpoint (a
  rollback like the others).

``result.jsonl`` is the record of what was reported: a result is appended there before
``job.json`` is rewritten, and loading a job (a restarted coordinator) takes its counters
from ``result.jsonl``'s last row, so a kill between the two writes neither loses nor
repeats a row; a torn last line (a kill mid-write) is moved aside to
``result.jsonl.torn`` with a warning in the job log, never a job that fails to load.

Roles: ``job.*`` takes client and admin keys (never node keys). A job belongs to the key
that submitted it (``owner_key`` in ``job.json``, kept across coordinator restarts): a
client key lists, follows, stops and reads only its own jobs, an admin key all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import shutil
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.algorithms.checkpoints import (
    BackgroundWriter,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from actorrl.algorithms.restarts import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    DEFAULT_FAILURE_WINDOW_S,
    DEFAULT_MAX_FAILURES,
    CarriedCounters,
    FailureWindow,
    RestartPolicy,
    Rollbacks,
    describe_failure,
)
from actorrl.algorithms.run_loop import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    CheckpointPolicy,
    run_trainer,
)
from actorrl.algorithms.stop import StopCriteria
from actorrl.algorithms.trainer import Survivors
from actorrl.cluster import RUNNING_STATES, TERMINAL_STATES, JobError
from actorrl.config.algorithm import load_config
from actorrl.config.sections import ConfigError
from actorrl.runtime.cluster.callers import (
    CLIENT_ROLES,
    Caller,
    current_caller,
    serve_async,
    serve_guarded,
    trusted_context,
)
from actorrl.runtime.cluster.coordinator import Coordinator, peer_name
from actorrl.runtime.cluster.driver import ClusterDriver
from actorrl.runtime.cluster.records import ActorRecord
from actorrl.runtime.errors import ActorDiedError, GetTimeoutError
from actorrl.util.files import atomic_write_json, jsonable
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

COLOCATE = {"replay-*": "learner"}
"""Replay shards sit next to the learner (RLlib places them with the learner too)."""
MAX_RESULTS_IN_MEMORY = 10_000
MAX_WAIT_S = 30.0

_current_job: contextvars.ContextVar[ManagedJob | None] = contextvars.ContextVar(
    "actorrl_job", default=None)


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """How the cluster runs a job (the ``"job"`` key of a submission)."""

    name: str = ""
    """A label for listings."""
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    """Checkpoint after an iteration when this long has passed since the last one
    (0: after every iteration); the default, 10 s, bounds what a learner loss rolls
    back."""
    max_failures: int | None = DEFAULT_MAX_FAILURES
    """Failures (each restarted from the last checkpoint) tolerated within
    ``failure_window_s``; one more within the window marks the job failed. None or -1:
    no limit; 0: the first failure ends the job."""
    failure_window_s: float | None = DEFAULT_FAILURE_WINDOW_S
    """The sliding window, in seconds, that ``max_failures`` counts in (None: since the
    job began)."""
    restart_backoff_s: float = BACKOFF_INITIAL_S
    """The wait before the first restart within the window, doubling with each more."""
    restart_backoff_max_s: float = BACKOFF_MAX_S
    """The longest wait before a restart."""
    placement: dict[str, str] = field(default_factory=dict)
    """Actor-name pattern (fnmatch: ``learner``, ``worker-*``) -> preferred node name."""
    keep_checkpoints: int = 2
    """Checkpoint files kept per job."""

    def __post_init__(self) -> None:
        problems = []
        if self.checkpoint_interval_s < 0:
            problems.append(f"job.checkpoint_interval_s must be >= 0, got "
                            f"{self.checkpoint_interval_s}")
        problems += self.restart_policy().problems("job.")
        if self.keep_checkpoints < 1:
            problems.append(f"job.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if not all(isinstance(k, str) and isinstance(v, str)
                   for k, v in self.placement.items()):
            problems.append("job.placement must map actor-name patterns to node names")
        if problems:
            raise ConfigError("invalid job options:", problems=problems)

    def restart_policy(self) -> RestartPolicy:
        """The job's :class:`~actorrl.algorithms.restarts.RestartPolicy`."""
        return RestartPolicy(max_failures=self.max_failures,
                             failure_window_s=self.failure_window_s,
                             backoff_initial_s=self.restart_backoff_s,
                             backoff_max_s=self.restart_backoff_max_s)


@dataclass(frozen=True)
class Submission:
    """A validated submission."""

    algorithm: str
    config: dict[str, Any]
    stop: dict[str, float]
    options: JobOptions

    @classmethod
    def parse(cls, submission: Any) -> Submission:
        """Validate a submission mapping; raises ConfigError listing every problem."""
        if not isinstance(submission, dict):
            raise ConfigError("a job submission must be a mapping with an 'algorithm' key")
        values = dict(submission)
        algorithm = values.pop("algorithm", None)
        if not isinstance(algorithm, str):
            raise ConfigError("a job submission needs 'algorithm' (e.g. 'apex')")
        try:
            spec = get_algorithm(algorithm)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        try:
            stop = StopCriteria.from_mapping(values.pop("stop", None) or {})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        job_values = values.pop("job", None) or {}
        if not isinstance(job_values, dict):
            raise ConfigError("'job' must be a mapping of job options")
        known = set(JobOptions.__dataclass_fields__)
        unknown = sorted(set(job_values) - known)
        if unknown:
            raise ConfigError(f"unknown job option(s) {unknown}; known: {sorted(known)}")
        try:
            options = JobOptions(**job_values)
        except TypeError as exc:
            raise ConfigError(f"invalid job options: {exc}") from None
        config = load_config(spec.config_cls, values)  # raises ConfigError with all problems
        del config
        return cls(spec.name, values, stop.to_mapping(), options)

    def to_dict(self) -> dict[str, Any]:
        """The submission as given (normalized)."""
        return {"algorithm": self.algorithm, **self.config, "stop": self.stop,
                "job": asdict(self.options)}


STOP_WAIT_S = 30.0
"""How long ``job.stop`` waits for a cancelled job to stop its actors before replying."""


COUNTERS = ("training_iteration", "timesteps_total", "num_steps_trained", "time_total_s")


class ManagedJob:
    """One job the :class:`JobManager` runs: its record, results, log and (while running) its
    Trainer. (Clients hold :class:`actorrl.cluster.client.Job`, a handle to one.)"""

    def __init__(self, job_id: str, submission: Submission, directory: str) -> None:
        self.id = job_id
        self.submission = submission
        self.dir = directory
        self.state = "pending"
        self.error = ""
        self.created_at = time.time()
        self.results: list[dict[str, Any]] = []
        self.results_offset = 0
        self.num_failures = 0
        """Failures since the job began (restarts from a checkpoint, or the last one)."""
        self.failures = FailureWindow(submission.options.restart_policy())
        """The failures within the restart policy's window (decides each restart)."""
        self.carried = CarriedCounters()
        """The failure counters of ``info`` continued across restarts."""
        self.rollbacks = Rollbacks()
        """Restarts from a checkpoint so far, and what each later result says of them."""
        self.checkpoint: dict[str, Any] | None = None
        self.checkpoint_lock = asyncio.Lock()
        """One checkpoint write at a time: the job's own (each interval, the last) and a
        client's ``job.checkpoint`` can meet at the same iteration."""
        self.writer = BackgroundWriter(f"checkpoint of job {self.id}")
        """Writes the job's interval checkpoints in a thread while training goes on."""
        self.last_counters: dict[str, float] = {}
        self.trainer: Trainer | None = None
        self.task: asyncio.Task | None = None
        self.changed = asyncio.Event()
        self.stop_reason = ""
        self.owner_key: str | None = None
        """The public key that submitted the job (None: a caller without CURVE)."""
        os.makedirs(directory, mode=0o700, exist_ok=True)

    @property
    def num_results(self) -> int:
        """Results published so far (across restarts)."""
        return self.results_offset + len(self.results)

    # ---- persistence --------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """What ``job.json`` holds (and ``status()`` returns)."""
        last = self.results[-1] if self.results else {}
        return {"job_id": self.id, "name": self.submission.options.name,
                "algorithm": self.submission.algorithm, "state": self.state,
                "error": self.error, "created_at": self.created_at,
                "num_results": self.num_results, "num_failures": self.num_failures,
                "failure_times": list(self.failures.times),
                "carried_counters": self.carried.totals(),
                "rollbacks": self.rollbacks.to_record(),
                "checkpoint": self.checkpoint, "stop_reason": self.stop_reason,
                "last_counters": self.last_counters, "owner_key": self.owner_key,
                "episode_reward_mean": jsonable(last.get("episode_reward_mean")),
                "submission": self.submission.to_dict()}

    def save(self) -> None:
        """Write ``job.json`` atomically."""
        atomic_write_json(os.path.join(self.dir, "job.json"), self.record(), indent=1)

    @classmethod
    def load(cls, directory: str) -> ManagedJob:
        """Rebuild a job from its directory (after a coordinator restart). Its results and
        counters are ``result.jsonl``'s (see the module docstring: a torn last line is
        moved aside with a warning)."""
        with open(os.path.join(directory, "job.json")) as f:
            record = json.load(f)
        job = cls(record["job_id"], Submission.parse(record["submission"]), directory)
        job.state = record["state"]
        job.error = record.get("error", "")
        job.created_at = record.get("created_at", job.created_at)
        job.num_failures = record.get("num_failures", 0)
        times = record.get("failure_times") or []
        job.failures.times = [float(t) for t in times if isinstance(t, (int, float))]
        job.carried = CarriedCounters(record.get("carried_counters") or {})
        rollbacks = record.get("rollbacks")
        job.rollbacks = Rollbacks(rollbacks if isinstance(rollbacks, dict) else None)
        job.checkpoint = record.get("checkpoint")
        job.last_counters = record.get("last_counters") or {}
        job.stop_reason = record.get("stop_reason", "")
        owner_key = record.get("owner_key")
        job.owner_key = owner_key if isinstance(owner_key, str) else None
        rows = job._read_results()
        keep = rows[-MAX_RESULTS_IN_MEMORY:]
        job.results_offset = len(rows) - len(keep)
        job.results = keep
        if rows:  # result.jsonl is newer than job.json when a kill fell between them
            last = rows[-1]
            for key in COUNTERS:
                if isinstance(last.get(key), (int, float)):
                    job.last_counters[key] = last[key]
            job.rollbacks.reported(last)
        return job

    def _read_results(self) -> list[dict[str, Any]]:
        """Every complete row of ``result.jsonl``. A torn last line (the coordinator was
        killed while appending it) is moved to ``result.jsonl.torn`` and the file cut
        back to its last complete row, so that rows appended later start on a line of
        their own; an unreadable line elsewhere is skipped. Both with a warning."""
        path = os.path.join(self.dir, "result.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, "rb") as f:
            data = f.read()
        rows: list[dict[str, Any]] = []
        position = 0
        for number, line in enumerate(data.splitlines(keepends=True), 1):
            start, position = position, position + len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"a row must be a JSON object, not {type(row).__name__}")
            except ValueError as exc:
                if position == len(data):  # the last line: a write cut short
                    with open(path + ".torn", "ab") as torn:
                        torn.write(line.rstrip(b"\n") + b"\n")
                    with open(path, "r+b") as f:
                        f.truncate(start)
                    self.log(f"result.jsonl: its last line ({number}) was cut short ({exc}); "
                             "moved to result.jsonl.torn and skipped (the job resumes from "
                             "its checkpoint)", logging.WARNING)
                else:
                    self.log(f"result.jsonl: line {number} is not a result ({exc}); "
                             "skipped", logging.WARNING)
                continue
            rows.append(row)
        if data and not data.endswith(b"\n") and rows and position == len(data):
            with open(path, "ab") as f:  # a complete last row without its newline
                f.write(b"\n")
        return rows

    def log(self, message: str, level: int = logging.INFO) -> None:
        """Write a line to the job log (and the coordinator log)."""
        token = _current_job.set(self)
        try:
            log.log(level, "[%s] %s", self.id, message)
        finally:
            _current_job.reset(token)

    def write_log_line(self, line: str) -> None:
        """Append to ``job.log``."""
        with open(os.path.join(self.dir, "job.log"), "a") as f:
            f.write(line + "\n")

    # ---- results ------------------------------------------------------------------------
    def publish(self, result: dict[str, Any]) -> dict[str, Any]:
        """Record a result, as the trainer counted it (after a rollback its counters are
        the checkpoint's plus what was done since: :class:`Rollbacks` marks it); the
        failure counters of ``info`` add the earlier attempts' counts. ``result["job"]``
        names the job, its failures and the iteration of its last checkpoint (results up
        to it can no longer be superseded)."""
        self.carried.apply(result)
        self.rollbacks.mark(result)
        for key in COUNTERS:
            if isinstance(result.get(key), (int, float)):
                self.last_counters[key] = result[key]
        result["job"] = {"job_id": self.id, "num_failures": self.num_failures,
                         "checkpoint_iteration": (self.checkpoint or {}).get("iteration")}
        plain = jsonable(result)
        self.results.append(plain)
        if len(self.results) > MAX_RESULTS_IN_MEMORY:
            drop = len(self.results) - MAX_RESULTS_IN_MEMORY
            del self.results[:drop]
            self.results_offset += drop
        with open(os.path.join(self.dir, "result.jsonl"), "a") as f:
            f.write(json.dumps(plain) + "\n")  # first: the record of what was reported
        self.save()
        self._wake()
        return plain

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def set_state(self, state: str, error: str = "") -> None:
        """Change the job state, persist it and wake result streams."""
        self.state = state
        if error:
            self.error = error
        self.save()
        self._wake()

    async def results_after(self, after: int, wait_s: float) -> dict[str, Any]:
        """Results with index >= ``after``, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        while self.num_results <= after and self.state not in TERMINAL_STATES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await wait_for(self.changed.wait(), remaining)
        start = max(after - self.results_offset, 0)
        return {"results": self.results[start:], "next": self.num_results,
                "state": self.state, "error": self.error,
                "skipped": max(self.results_offset - after, 0)}


class _JobLogRouter(logging.Handler):
    """Copies log records emitted while a job's task runs into that job's log file."""

    def emit(self, record: logging.LogRecord) -> None:
        job = _current_job.get()
        if job is None:
            return
        try:
            job.write_log_line(self.format(record))
        except Exception:
            self.handleError(record)


class AttemptFailed(Exception):
    """An attempt of a job failed with ``cause``; ``survivors``: its actors that still
    answer (rollout workers, replay shards), for the next attempt to take over."""

    def __init__(self, cause: Exception, survivors: Survivors | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.survivors = survivors


SALVAGE_TIMEOUT_S = 60.0
"""Bound on taking a failed attempt's live actors over (pings, pipeline stop)."""


class JobManager:
    """Runs jobs on a :class:`Coordinator` and serves the ``job.*`` protocol."""

    def __init__(self, coordinator: Coordinator, state_dir: str) -> None:
        self.coordinator = coordinator
        self.state_dir = state_dir
        self.jobs: dict[str, ManagedJob] = {}
        os.makedirs(os.path.join(state_dir, "jobs"), mode=0o700, exist_ok=True)
        self._router = _JobLogRouter()
        self._router.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._router)
        coordinator.on_actor_died.append(self._on_actor_died)
        coordinator.extra_status.append(lambda: {"jobs": self.list_jobs(current_caller())})

    def serve(self) -> None:
        """Serve ``job.submit``, ``job.results``, ``job.status``, ``job.list``,
        ``job.stop``, ``job.checkpoint`` and ``job.logs``."""
        rt = self.coordinator.runtime
        serve_async(rt, "job.submit", self.submit, CLIENT_ROLES)
        serve_async(rt, "job.results", self._rpc_results, CLIENT_ROLES)
        serve_async(rt, "job.stop", self.stop_job, CLIENT_ROLES)
        serve_async(rt, "job.checkpoint", self._rpc_checkpoint, CLIENT_ROLES)
        serve_guarded(rt, "job.status", lambda r: r.reply(self._job(*r.args).record()),
                      CLIENT_ROLES)
        serve_guarded(rt, "job.list", lambda r: r.reply(self.list_jobs(current_caller())),
                      CLIENT_ROLES)
        serve_guarded(rt, "job.logs", lambda r: r.reply(self.logs(*r.args)), CLIENT_ROLES)
        serve_guarded(rt, "job.actors", lambda r: r.reply(self.coordinator.describe_actors(
            f"job:{self._job(*r.args).id}")), CLIENT_ROLES)

    def _job(self, job_id: Any) -> ManagedJob:
        """The job ``job_id`` (or the one job whose id starts with it) among the jobs the
        current caller may see (its own, or all for an admin or an in-process caller)."""
        caller = current_caller()
        visible = {i: j for i, j in self.jobs.items() if caller.owns(j.owner_key)}
        job = visible.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            matches = [j for i, j in visible.items() if isinstance(job_id, str) and
                       job_id and i.startswith(job_id)]
            if len(matches) == 1:
                return matches[0]
            whose = "" if caller.is_admin else " of this client key"
            hidden = "" if caller.is_admin or len(visible) == len(self.jobs) else (
                "; jobs submitted with other keys are visible to their key and to admin "
                "keys only")
            raise JobError(f"no job {job_id!r}{whose} (jobs: {', '.join(visible) or 'none'})"
                           f"{hidden}")
        return job

    def list_jobs(self, caller: Caller | None = None) -> list[dict[str, Any]]:
        """A summary of every job (that ``caller`` may see, when given)."""
        out = []
        for job in sorted(self.jobs.values(), key=lambda j: j.created_at):
            if caller is not None and not caller.owns(job.owner_key):
                continue
            record = job.record()
            record.pop("submission")
            out.append(record)
        return out

    def logs(self, job_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> dict[str, Any]:
        """Bytes of ``job.log`` from ``offset`` (at most ``max_bytes``)."""
        job = self._job(job_id)
        path = os.path.join(job.dir, "job.log")
        if not os.path.exists(path):
            return {"text": "", "next": 0}
        with open(path, "rb") as f:
            f.seek(max(int(offset), 0))
            data = f.read(min(max(int(max_bytes), 0), 16 << 20))
        return {"text": data.decode(errors="replace"), "next": max(int(offset), 0) + len(data)}

    # ---- submit / run -------------------------------------------------------------------
    async def submit(self, submission: Any, wire_version: Any = None) -> str:
        """Validate and start a job; returns its id. A client of another wire version (or
        one from before versions, which sends none) is refused first."""
        self.coordinator.versions.admit(wire_version, "client",
                                        peer_name(current_caller()))
        parsed = Submission.parse(submission)
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        job = ManagedJob(job_id, parsed, os.path.join(self.state_dir, "jobs", job_id))
        job.owner_key = current_caller().key
        self.coordinator.owner_keys[f"job:{job_id}"] = job.owner_key
        self.jobs[job_id] = job
        job.save()
        job.log(f"submitted: {parsed.algorithm}, stop {parsed.stop or 'never'}")
        self._start(job)
        return job_id

    def _start(self, job: ManagedJob) -> None:
        # The job runs for no caller in particular (not as the client whose submit or
        # restart started it): a trusted context.
        job.task = asyncio.get_running_loop().create_task(self._run(job),
                                                          context=trusted_context())

    async def resume_all(self) -> list[str]:
        """Load every job in the state directory; restart the ones that were running."""
        resumed = []
        root = os.path.join(self.state_dir, "jobs")
        for entry in sorted(os.listdir(root)):
            directory = os.path.join(root, entry)
            if entry in self.jobs or not os.path.exists(os.path.join(directory, "job.json")):
                continue
            try:
                job = ManagedJob.load(directory)
            except Exception as exc:
                log.error("cannot load job %s: %s", entry, exc)
                continue
            self.jobs[job.id] = job
            self.coordinator.owner_keys[f"job:{job.id}"] = job.owner_key
            if job.state in RUNNING_STATES:
                where = (f"checkpoint of iteration {job.checkpoint['iteration']}"
                         if job.checkpoint else "scratch")
                job.log(f"coordinator restarted; resuming from {where}")
                self._start(job)
                resumed.append(job.id)
        return resumed

    async def _run(self, job: ManagedJob) -> None:
        _current_job.set(job)
        # One driver for every attempt: a restart replaces what died and keeps the live
        # rollout workers and replay shards (with their contents) of the failed attempt.
        driver = self._new_driver(job)
        survivors: Survivors | None = None
        try:
            while True:
                try:
                    await self._attempt(job, driver, survivors)
                    job.log(f"finished: {job.stop_reason}")
                    job.set_state("finished")
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as caught:
                    failed = caught if isinstance(caught, AttemptFailed) else None
                    survivors = failed.survivors if failed is not None else None
                    exc = failed.cause if failed is not None else caught
                    job.num_failures += 1
                    job.carried.restarted()
                    decision = job.failures.record()
                    if isinstance(exc, ActorDiedError):  # a fault, not a bug: one line
                        log.debug("[%s] %s", job.id, traceback.format_exc())
                        job.log(f"iteration failed: {describe_failure(exc)}", logging.ERROR)
                    else:
                        job.log(f"iteration failed: {exc!r}\n{traceback.format_exc()}",
                                logging.ERROR)
                    if not decision.restart:
                        job.set_state("failed", f"{type(exc).__name__}: {exc}")
                        job.log(f"failed: {decision.describe()} (job.max_failures per "
                                "job.failure_window_s)", logging.ERROR)
                        return
                    where = (f"checkpoint of iteration {job.checkpoint['iteration']}"
                             if job.checkpoint else "scratch (no checkpoint yet)")
                    kept = (f"; keeping {len(survivors)} live actors (rollout workers, "
                            "replay shards and their contents)" if survivors else
                            "; all replay contents are lost")
                    job.log(f"restarting from {where} ({decision.describe()}; "
                            f"{job.num_failures} since the job began); progress since that "
                            f"checkpoint is lost{kept}", logging.WARNING)
                    job.set_state("restarting")
                    await asyncio.sleep(decision.delay_s)  # the backoff
        except asyncio.CancelledError:
            if job.state not in TERMINAL_STATES and job.state != "interrupted":
                job.set_state("stopped")
            raise
        finally:
            if survivors is not None:
                with contextlib.suppress(Exception):
                    await wait_for(survivors.release(), 30)
            await driver.shutdown()

    def _new_driver(self, job: ManagedJob) -> ClusterDriver:
        """The driver that places ``job``'s actors (owner ``job:<id>``), for all its
        attempts."""
        return ClusterDriver(self.coordinator, f"job:{job.id}",
                             placement=job.submission.options.placement, colocate=COLOCATE)

    async def _attempt(self, job: ManagedJob, driver: ClusterDriver,
                       survivors: Survivors | None) -> None:
        """One attempt of the job on ``driver``, starting from ``survivors`` (live actors of
        the failed attempt before, or None). A failure raises :class:`AttemptFailed`
        carrying the actors of this attempt that still answer (the rest are stopped)."""
        spec = get_algorithm(job.submission.algorithm)
        config = load_config(spec.config_cls, job.submission.config)
        trainer: Trainer | None = None
        try:
            trainer = await Trainer.create(spec, config, driver, results_dir=job.dir,
                                           survivors=survivors)
            job.trainer = trainer
            where = {a["name"]: a["node"] for a in
                     self.coordinator.describe_actors(f"job:{job.id}")}
            job.log(f"placed: {where}")
            await self._flush_writes(job)  # the failed attempt's last write, if any
            if job.checkpoint is not None:
                await self._restore(job, trainer)
            if job.num_results:  # a rollback: counters continue from the checkpoint's
                self._rolled_back(job, trainer)
            job.set_state("running")

            async def save(final: bool) -> None:
                if final:
                    await self._checkpoint(job, trainer)
                else:  # training waits only for the state's copy, not for the disk
                    await self._checkpoint_in_background(job, trainer)

            # The first iteration is always checkpointed, then every interval, and the last.
            policy = CheckpointPolicy(save=save,
                                      every_s=job.submission.options.checkpoint_interval_s)
            outcome = await run_trainer(trainer, StopCriteria.from_mapping(job.submission.stop),
                                        [job.publish], policy)
            job.stop_reason = outcome.reason  # actors stop before the job is marked finished
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            kept = None
            if trainer is not None:
                job.trainer, failed, trainer = None, trainer, None
                try:
                    kept = await wait_for(failed.salvage(), SALVAGE_TIMEOUT_S)
                except Exception as salvage_exc:  # noqa: BLE001 - start all afresh
                    log.debug("[%s] salvage failed: %r", job.id, salvage_exc)
                    with contextlib.suppress(Exception):
                        await wait_for(failed.stop(), 30)
            raise AttemptFailed(exc, kept) from exc
        finally:
            job.trainer = None
            if trainer is not None:
                with contextlib.suppress(Exception):
                    await wait_for(trainer.stop(), 30)

    async def _restore(self, job: ManagedJob, trainer: Trainer) -> None:
        assert job.checkpoint is not None
        folder, state = await asyncio.to_thread(read_checkpoint, job.checkpoint["path"])
        await trainer.set_state(state)
        job.log(f"restored {folder.name} (iteration {job.checkpoint['iteration']})")

    @staticmethod
    def _rolled_back(job: ManagedJob, trainer: Trainer) -> None:
        """Note that ``job`` resumes at ``trainer``'s (restored) counters although it had
        reported results beyond them: later results say so, earlier rows are superseded."""
        counters = trainer.counters()
        iteration = int(counters["training_iteration"])
        job.rollbacks.restored(iteration, int(counters["timesteps_total"]))
        reported = job.last_counters.get("training_iteration")
        lost = (f"; the rows of iterations {iteration + 1}-{int(reported)} are superseded "
                "(kept in result.jsonl, left out of plots and summaries)"
                if isinstance(reported, (int, float)) and reported > iteration else "")
        job.log(f"rolled back to iteration {iteration} (restart "
                f"{job.rollbacks.num_restarts}){lost}", logging.WARNING)

    async def _checkpoint(self, job: ManagedJob, trainer: Trainer) -> dict[str, Any]:
        """Write ``checkpoints/checkpoint_<iteration>/`` (the format ``actorrl train``
        writes and ``actorrl evaluate`` reads) and wait for it; keep the newest
        ``keep_checkpoints``. Background writes submitted before finish first."""
        async with job.checkpoint_lock:
            await self._flush_writes(job)
            state = await trainer.get_state()
            written = job.checkpoint
            if written is not None and written["iteration"] == int(state["iteration"]) \
                    and os.path.isdir(written["path"]):
                return written  # this iteration is on disk already
            record = await asyncio.to_thread(self._store_checkpoint, job, state)
            self._written(job, record)
            return record

    async def _checkpoint_in_background(self, job: ManagedJob, trainer: Trainer) -> None:
        """Copy the trainer's state and hand its write to the job's background writer (one
        write at a time; a newer state replaces one still waiting). ``job.checkpoint``, and
        so what a restart restores, moves to it once it is on disk."""
        async with job.checkpoint_lock:
            state = await trainer.get_state()
            written = job.checkpoint
            if written is not None and written["iteration"] == int(state["iteration"]):
                return
            job.writer.submit(lambda: self._store_checkpoint(job, state),
                              lambda record: self._written(job, record))

    @staticmethod
    async def _flush_writes(job: ManagedJob) -> None:
        """Wait for the job's background checkpoint writes (a failed one was logged)."""
        with contextlib.suppress(Exception):
            await job.writer.flush()

    @staticmethod
    def _store_checkpoint(job: ManagedJob, state: dict[str, Any]) -> dict[str, Any]:
        """Write ``state`` as a checkpoint and prune to ``keep_checkpoints`` (blocking: run
        in a thread); the record ``job.checkpoint`` takes once it is on disk."""
        last = job.results[-1] if job.results else {}
        metadata = {"algorithm": job.submission.algorithm, "env": state["config"].get("env"),
                    "training_iteration": int(state["iteration"]),
                    "timesteps_total": int(state["timesteps_total"]),
                    "episode_reward_mean": last.get("episode_reward_mean"), "job_id": job.id}
        checkpoints = os.path.join(job.dir, "checkpoints")
        folder = write_checkpoint(checkpoints, state, metadata)
        keep = job.submission.options.keep_checkpoints
        for old in list_checkpoints(checkpoints)[:-keep]:
            shutil.rmtree(old, True)
        return {"path": str(folder), "iteration": int(state["iteration"]),
                "timesteps_total": int(state["timesteps_total"]), "created_at": time.time()}

    @staticmethod
    def _written(job: ManagedJob, record: dict[str, Any]) -> None:
        """A checkpoint is on disk: the job's latest (what a restart restores)."""
        if job.checkpoint is None or record["iteration"] >= job.checkpoint["iteration"] or \
                not os.path.isdir(job.checkpoint["path"]):
            job.checkpoint = record
            job.save()

    # ---- requests -----------------------------------------------------------------------
    async def _rpc_results(self, job_id: str, after: int = 0, wait_s: float = 10.0
                           ) -> dict[str, Any]:
        return await self._job(job_id).results_after(int(after), float(wait_s))

    async def _rpc_checkpoint(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        trainer = job.trainer
        if trainer is not None:
            try:
                return await self._checkpoint(job, trainer)
            except Exception as exc:
                if job.trainer is not None or job.checkpoint is None:
                    raise
                # The job ended meanwhile (its own stop criterion): its last checkpoint
                # is the one asked for.
                job.log(f"checkpoint request met the job's end ({exc!r}); answering with "
                        "its final checkpoint")
        if job.checkpoint is None:
            raise JobError(f"job {job.id} is {job.state} and has no checkpoint")
        return job.checkpoint

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        """Stop a job (its actors are stopped); returns its record."""
        job = self._job(job_id)
        if job.task is not None and not job.task.done():
            job.log("stop requested")
            job.task.cancel()
            # Bounded: a job whose clean-up is slow still answers the stop promptly; its
            # task finishes stopping its actors in the background.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await wait_for(asyncio.shield(job.task), STOP_WAIT_S)
            if not job.task.done():
                job.log(f"still stopping its actors after {STOP_WAIT_S:g} s; continuing in "
                        "the background", logging.WARNING)
        if job.state not in TERMINAL_STATES:
            job.set_state("stopped")
        return job.record()

    def _on_actor_died(self, record: ActorRecord) -> None:
        if not record.owner.startswith("job:"):
            return
        job = self.jobs.get(record.owner[4:])
        if job is None:
            return
        what = record.spec.name or record.spec.class_path
        reason = record.reason.strip().splitlines()[0] if record.reason.strip() else "?"
        if what.startswith("worker-"):
            # The pipeline replaces a rollout worker and logs it as one line (what died,
            # why, replaced or not): this one is for the coordinator's log only.
            log.debug("[%s] actor %s died: %s", job.id, what, reason)
            return
        extra = ""
        if what.startswith("replay-"):
            extra = "; the replay data it held is lost"
        job.log(f"actor {what} died: {reason}{extra}", logging.WARNING)

    async def shutdown(self, checkpoint: bool = True) -> None:
        """Checkpoint running jobs (best effort), then stop them as ``interrupted`` so a
        restarted coordinator resumes them."""
        running = [j for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for job in running:
            if checkpoint and job.trainer is not None:
                try:
                    await wait_for(self._checkpoint(job, job.trainer), 30)
                except (Exception, GetTimeoutError) as exc:
                    job.log(f"final checkpoint failed: {exc}", logging.WARNING)
            job.set_state("interrupted")
            job.log("coordinator shutting down; the job resumes when it restarts")
            assert job.task is not None
            job.task.cancel()
        for job in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job.task  # type: ignore[misc]
        logging.getLogger().removeHandler(self._router)
