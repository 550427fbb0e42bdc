"""Experiment trackers: every result of a run to Weights & Biases and/or MLflow.

Asked for with ``actorrl train --wandb PROJECT`` / ``--mlflow URI``, or in a config file
under ``logger_config`` with the setting names of Tune's ``WandbLoggerCallback`` and
``MLflowLoggerCallback``::

    logger_config:
      wandb: {project: cartpole, group: baseline, entity: me, tags: [ppo]}
      mlflow: {tracking_uri: ./mlruns, experiment_name: cartpole}

A tracker is a result sink beside ``result.jsonl``, ``progress.csv`` and TensorBoard
(:class:`TrackerSet`, fed by the run loop): each result's numbers, flattened with ``/``
(``info/learner/policy_loss``), are logged at step ``training_iteration``;
the resolved config is the run's config (W&B) or its parameters (MLflow, flattened); each
checkpoint folder is uploaded as an artifact (W&B ``model`` artifact, MLflow
``checkpoints/checkpoint_<n>/``) unless ``upload_checkpoints`` / ``save_artifact`` is false;
the run ends with the training run's status.

A tracker never receives a step that a rollback supersedes (a restart from the last
checkpoint does the iterations after it again): :class:`TrackerSet` holds each result back
until it is *committed*, that is a checkpoint at or after its iteration was written
(:meth:`TrackerSet.checkpoint`, or :meth:`TrackerSet.commit` with a cluster job's
``job.checkpoint_iteration``), or the run ended; a result whose iteration is not above the
held ones drops those it supersedes. So trackers lag the results folder by up to one
checkpoint interval. The trials of a sweep are one run each,
grouped: W&B's ``group`` and MLflow's experiment default to the sweep folder's name.

No network is needed: W&B's offline mode (``WANDB_MODE=offline`` or ``mode: offline``)
writes ``<results folder>/wandb/offline-run-*`` (``wandb sync`` uploads it later), and a
local MLflow store is a folder (``--mlflow ./mlruns``, MLflow's file store; actorrl sets
``MLFLOW_ALLOW_FILE_STORE=true`` for it, which MLflow 3 asks for) or a SQLite file
(``--mlflow sqlite:///mlflow.db``).

wandb and mlflow are optional extras, imported only when a tracker is asked for; without
them the request fails before anything starts, naming ``pip install -e ".[wandb]"``. A
tracker that fails mid-run (a lost server) is dropped with one warning; training goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actorrl.experiment.errors import UsageError
from actorrl.experiment.extras import require_extra
from actorrl.experiment.results import flatten_result

log = logging.getLogger(__name__)

TRACKERS = ("wandb", "mlflow")
"""The ``logger_config`` sections actorrl reads."""
WANDB_KEYS: dict[str, str] = {
    "project": "the W&B project (else $WANDB_PROJECT); required",
    "group": "groups runs (default: the sweep's name for a sweep's trials, else $WANDB_GROUP)",
    "entity": "the W&B user or team",
    "name": "the run's name (default: the results folder's name)",
    "tags": "a list of tags",
    "notes": "a description of the run",
    "job_type": "W&B's job type",
    "mode": "online, offline or disabled (default: $WANDB_MODE, else online)",
    "dir": "where W&B writes its run folder (default: the results folder)",
    "api_key": "the API key (else wandb login or $WANDB_API_KEY)",
    "api_key_file": "a file holding the API key",
    "excludes": "result keys (flattened, or their prefixes) not to log",
    "log_config": "accepted for Tune's files: the config is always the run's config",
    "upload_checkpoints": "upload each checkpoint as a model artifact (default: true)",
    "save_checkpoints": "Tune's older name of upload_checkpoints",
}
"""``logger_config.wandb`` keys (Tune's ``WandbLoggerCallback`` names plus ``wandb.init``'s)."""
MLFLOW_KEYS: dict[str, str] = {
    "tracking_uri": "a folder, file:, sqlite:/// or http(s):// URI (else "
                    "$MLFLOW_TRACKING_URI); required",
    "registry_uri": "MLflow's model registry URI",
    "experiment_name": "the experiment (default: $MLFLOW_EXPERIMENT_NAME, else the sweep's "
                       "name for a sweep's trials, else actorrl)",
    "tags": "a mapping of run tags",
    "tracking_token": "a token for the tracking server (sets $MLFLOW_TRACKING_TOKEN)",
    "save_artifact": "log each checkpoint folder as artifacts (default: true)",
}
"""``logger_config.mlflow`` keys (Tune's ``MLflowLoggerCallback`` names)."""
DEFAULT_EXPERIMENT = "actorrl"
PARAM_VALUE_CHARS = 6000
"""MLflow's limit on a parameter value's length (longer values are cut, marked ``...``)."""
_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_MLFLOW_NAME = re.compile(r"[^A-Za-z0-9_\-. /]")


@dataclass(frozen=True)
class TrackerSettings:
    """The trackers a run logs to, each with its ``logger_config`` settings (validated)."""

    wandb: dict[str, Any] | None = None
    mlflow: dict[str, Any] | None = None
    group: str | None = None
    """A sweep's name: its trials are grouped under it (see the module docstring)."""

    def grouped(self, group: str) -> TrackerSettings:
        """These settings for one trial of the sweep ``group``."""
        return dataclasses.replace(self, group=group)

    def names(self) -> list[str]:
        """The trackers asked for (``wandb``, ``mlflow``)."""
        return [name for name in TRACKERS if getattr(self, name) is not None]


def tracker_settings(logger_config: Any = None, *, wandb_project: str | None = None,
                     mlflow_uri: str | None = None, where: str = "logger_config"
                     ) -> TrackerSettings | None:
    """The trackers of a run: a config file's ``logger_config`` mapping (``where`` names it
    in errors), with ``--wandb PROJECT`` / ``--mlflow URI`` setting (or overriding) the
    project and tracking URI. None when no tracker is asked for. :class:`UsageError` for an
    unknown key, a missing project or URI, or a missing extra."""
    sections = _sections(logger_config, where)
    wandb = sections.get("wandb")
    mlflow = sections.get("mlflow")
    if wandb_project is not None:
        wandb = {**(wandb or {}), "project": wandb_project}
    if mlflow_uri is not None:
        mlflow = {**(mlflow or {}), "tracking_uri": mlflow_uri}
    if wandb is not None:
        wandb = _checked(wandb, WANDB_KEYS, f"{where}.wandb")
        wandb.setdefault("project", os.environ.get("WANDB_PROJECT"))
        if not wandb["project"]:
            raise UsageError(f"{where}.wandb needs a project: --wandb PROJECT, "
                             f"{where}: {{wandb: {{project: NAME}}}} or $WANDB_PROJECT")
        require_extra("wandb", "wandb", "logging to Weights & Biases (--wandb)")
    if mlflow is not None:
        mlflow = _checked(mlflow, MLFLOW_KEYS, f"{where}.mlflow")
        mlflow.setdefault("tracking_uri", os.environ.get("MLFLOW_TRACKING_URI"))
        if not mlflow["tracking_uri"]:
            raise UsageError(f"{where}.mlflow needs a tracking URI: --mlflow URI (a folder "
                             "such as ./mlruns, sqlite:///mlflow.db or http://HOST:5000), "
                             f"{where}: {{mlflow: {{tracking_uri: URI}}}} or "
                             "$MLFLOW_TRACKING_URI")
        require_extra("mlflow", "mlflow", "logging to MLflow (--mlflow)")
    if wandb is None and mlflow is None:
        return None
    return TrackerSettings(wandb=wandb, mlflow=mlflow)


def _sections(logger_config: Any, where: str) -> dict[str, Any]:
    if logger_config is None:
        return {}
    if not isinstance(logger_config, Mapping):
        raise UsageError(f"{where} must be a mapping such as {{wandb: {{project: NAME}}}}, "
                         f"got {logger_config!r}")
    unknown = sorted(str(k) for k in logger_config if k not in TRACKERS)
    if unknown:
        raise UsageError(f"{where} has {unknown}; actorrl reads its sections "
                         f"{', '.join(TRACKERS)} (Tune's other loggers are actorrl's results "
                         "folder: CSV, JSON lines and TensorBoard are always written)")
    return dict(logger_config)


def _checked(values: Any, known: Mapping[str, str], where: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise UsageError(f"{where} must be a mapping of settings, got {values!r}")
    unknown = sorted(str(k) for k in values if k not in known)
    if unknown:
        raise UsageError(f"{where} has unknown settings {unknown}; known: "
                         f"{', '.join(known)}")
    return dict(values)


# ---- what is logged ----------------------------------------------------------------------
def result_metrics(result: Mapping[str, Any], excludes: Iterable[str] = ()
                   ) -> dict[str, float]:
    """The finite numbers of ``result``, flattened with ``/``; a key in ``excludes``, or
    under one, is left out (as is a result's ``config``)."""
    skip = ("config", *excludes)
    metrics: dict[str, float] = {}
    for key, value in flatten_result(dict(result)).items():
        if any(key == s or key.startswith(f"{s}/") for s in skip):
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            metrics[key] = float(value)
    return metrics


def config_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The config flattened with ``/`` into MLflow parameters (strings, cut to
    :data:`PARAM_VALUE_CHARS`)."""
    params = {}
    for key, value in flatten_result(dict(config)).items():
        text = "None" if value is None else str(value)
        if len(text) > PARAM_VALUE_CHARS:
            text = text[:PARAM_VALUE_CHARS - 3] + "..."
        params[key] = text
    return params


@dataclass(frozen=True)
class RunInfo:
    """What a tracker's run is told about the training run."""

    name: str
    """The run's name: its results folder's (a sweep trial's folder name)."""
    run_dir: Path
    config: dict[str, Any] = field(repr=False)
    """The resolved config, ``algorithm`` included (as ``config.json``)."""
    group: str | None = None


class Tracker:
    """One tracker's run (subclasses: :class:`WandbTracker`, :class:`MlflowTracker`)."""

    name = "tracker"

    def log_result(self, result: Mapping[str, Any]) -> None:
        """Log one iteration's result."""
        raise NotImplementedError

    def log_checkpoint(self, path: Path) -> None:
        """Log the checkpoint folder ``path`` as an artifact (when configured to)."""
        raise NotImplementedError

    def close(self, status: str, exit_code: int) -> None:
        """End the run with the training run's ``status`` (finished, interrupted, failed)."""
        raise NotImplementedError


class WandbTracker(Tracker):
    """A W&B run (``wandb.init``); see the module docstring."""

    name = "wandb"

    def __init__(self, settings: Mapping[str, Any], info: RunInfo, group: str | None) -> None:
        # W&B's own terminal lines would break into the progress display ($WANDB_SILENT
        # false brings them back); its logs are in its run folder.
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        cfg = dict(settings)
        api_key = cfg.pop("api_key", None)
        key_file = cfg.pop("api_key_file", None)
        if key_file:
            api_key = Path(os.path.expanduser(key_file)).read_text().strip()
        if api_key:
            os.environ["WANDB_API_KEY"] = api_key
        self.excludes = list(cfg.pop("excludes", None) or [])
        upload = cfg.pop("upload_checkpoints", cfg.pop("save_checkpoints", True))
        self.upload_checkpoints = bool(upload)
        cfg.pop("log_config", None)
        cfg.setdefault("group", group or os.environ.get("WANDB_GROUP"))
        cfg.setdefault("name", info.name)
        cfg.setdefault("dir", str(info.run_dir))
        self.run = wandb.init(config=info.config, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True), **cfg)
        self._wandb = wandb

    def log_result(self, result: Mapping[str, Any]) -> None:
        """``run.log`` of the result's numbers at step ``training_iteration``."""
        step = int(result.get("training_iteration", 0))
        self.run.log(result_metrics(result, self.excludes), step=step)

    def log_checkpoint(self, path: Path) -> None:
        """The checkpoint folder as a ``model`` artifact ``checkpoint-<run id>``."""
        if not self.upload_checkpoints:
            return
        artifact = self._wandb.Artifact(f"checkpoint-{self.run.id}", type="model",
                                        metadata={"checkpoint": path.name})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=["latest", path.name])

    def close(self, status: str, exit_code: int) -> None:
        """``run.finish`` with the run's exit code (nonzero: W&B marks it failed)."""
        self.run.finish(exit_code=exit_code)


def mlflow_uri(uri: str) -> str:
    """A tracking URI for MLflow: a plain path becomes a ``file:`` URI (a local file
    store, for which ``MLFLOW_ALLOW_FILE_STORE`` is set, see the module docstring)."""
    if "://" not in uri and not uri.startswith("file:"):
        uri = Path(uri).expanduser().resolve().as_uri()
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


class MlflowTracker(Tracker):
    """An MLflow run in an experiment (``MlflowClient``); see the module docstring."""

    name = "mlflow"

    def __init__(self, settings: Mapping[str, Any], info: RunInfo, group: str | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        cfg = dict(settings)
        if cfg.get("tracking_token"):
            os.environ["MLFLOW_TRACKING_TOKEN"] = str(cfg["tracking_token"])
        self.save_artifact = bool(cfg.get("save_artifact", True))
        self.client = MlflowClient(tracking_uri=mlflow_uri(str(cfg["tracking_uri"])),
                                   registry_uri=cfg.get("registry_uri"))
        experiment = (cfg.get("experiment_name") or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                      or group or DEFAULT_EXPERIMENT)
        tags = {str(k): str(v) for k, v in dict(cfg.get("tags") or {}).items()}
        tags.update({"actorrl.algorithm": str(info.config.get("algorithm")),
                     "actorrl.env": str(info.config.get("env")),
                     "actorrl.results_dir": str(info.run_dir)})
        if group:
            tags["actorrl.group"] = group
        run = self.client.create_run(self._experiment_id(experiment), run_name=info.name,
                                     tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in config_params(info.config).items()]
        for i in range(0, len(params), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + _BATCH_PARAMS])

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # a concurrent trial created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log_result(self, result: Mapping[str, Any]) -> None:
        """``log_batch`` of the result's numbers at step ``training_iteration`` (names
        with characters MLflow refuses get ``_`` instead)."""
        from mlflow.entities import Metric

        step = int(result.get("training_iteration", 0))
        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_NAME.sub("_", k), v, now, step)
                   for k, v in result_metrics(result).items()]
        for i in range(0, len(metrics), _BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH_METRICS])

    def log_checkpoint(self, path: Path) -> None:
        """The checkpoint folder's files under the run's ``checkpoints/<folder name>/``."""
        if self.save_artifact:
            self.client.log_artifacts(self.run_id, str(path),
                                      artifact_path=f"checkpoints/{path.name}")

    def close(self, status: str, exit_code: int) -> None:
        """The run ends FINISHED, KILLED (interrupted) or FAILED."""
        state = {"finished": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, state)


class TrackerSet:
    """The trackers of one training run, as one result sink. A tracker whose call fails
    is dropped with a warning naming it (training goes on)."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers
        self.held: list[Mapping[str, Any]] = []
        """Results recorded but not yet committed (see the module docstring)."""

    @classmethod
    def open(cls, settings: TrackerSettings | None, info: RunInfo) -> TrackerSet:
        """Start a run in every tracker of ``settings`` (none: an empty set). A tracker
        that cannot start raises (the training run fails before it trains)."""
        trackers: list[Tracker] = []
        if settings is None:
            return cls(trackers)
        try:
            if settings.wandb is not None:
                trackers.append(WandbTracker(settings.wandb, info, settings.group))
            if settings.mlflow is not None:
                trackers.append(MlflowTracker(settings.mlflow, info, settings.group))
        except BaseException:
            cls(trackers).close("failed", 1)
            raise
        return cls(trackers)

    def record(self, result: Mapping[str, Any]) -> None:
        """Hold ``result`` for the trackers until it is committed; held results it
        supersedes (a rollback: its iteration is not above theirs) are dropped unsent."""
        iteration = _iteration(result)
        if iteration is not None:
            kept = [r for r in self.held if (_iteration(r) or 0) < iteration]
            if len(kept) < len(self.held):
                log.debug("trackers: %d result(s) superseded by a rollback to iteration "
                          "%d; not logged", len(self.held) - len(kept), iteration - 1)
            self.held = kept
        self.held.append(result)

    def commit(self, through: int | None = None) -> None:
        """Log the held results of iterations up to ``through`` (None: all of them) to
        every tracker: a checkpoint of that iteration exists, no rollback undoes them."""
        ready = [r for r in self.held
                 if through is None or (_iteration(r) or 0) <= through]
        if not ready:
            return
        self.held = [r for r in self.held if not any(r is s for s in ready)]
        for result in ready:
            self._each("log a result", lambda t, r=result: t.log_result(r))

    def checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Commit every held result (the checkpoint is of the latest one) and log a
        checkpoint folder (skipped when it is not on this machine: an ``--address``
        run's checkpoints are on the coordinator's host)."""
        self.commit()
        folder = Path(path)
        if not folder.is_dir():
            log.debug("checkpoint %s is not on this machine: not uploaded", folder)
            return
        self._each("upload a checkpoint", lambda t: t.log_checkpoint(folder))

    def close(self, status: str, exit_code: int) -> None:
        """Log what is held (the run ended: nothing will supersede it) and end every
        tracker's run."""
        self.commit()
        self._each("finish its run", lambda t: t.close(status, exit_code))
        self.trackers = []

    def _each(self, what: str, call: Any) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:
                log.warning("%s tracker failed to %s (%s: %s); it is dropped, training "
                            "goes on", tracker.name, what, type(exc).__name__, exc)
                self.trackers.remove(tracker)


def _iteration(result: Mapping[str, Any]) -> int | None:
    value = result.get("training_iteration")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
