"""``actorrl train``: validate every input, then run one training job to a stop criterion.

:func:`plan_training` checks the algorithm, config file, ``--set`` overrides, env id and
checkpoint before anything starts (bad input raises :class:`UsageError`, exit code 2, and
leaves no folder behind). :class:`LocalRun` then starts an embedded local cluster (a
:class:`~actorrl.runtime.Driver` in this process; workers, learner and replay shards as
child processes, or, with ``--serial``, every actor in this process and event loop),
trains with :func:`~actorrl.algorithms.run_loop.run_trainer`, records every result,
checkpoints (by default after the first iteration and then every
:data:`DEFAULT_CHECKPOINT_INTERVAL_S` seconds, ``--checkpoint-every N``: every N iterations;
the learner's state is copied in memory and written to disk in the background while
training goes on, :class:`~actorrl.algorithms.checkpoints.BackgroundWriter`; keeping the
newest ``--keep-checkpoints`` and the best: :mod:`actorrl.experiment.retention`), restarts
from the last checkpoint when an actor the pipeline cannot replace dies (``--max-failures``
per ``--failure-window``: :mod:`actorrl.experiment.recovery`), and shuts everything down.
:class:`TrainingRun` is what a local run and an ``--address`` run
(:mod:`actorrl.experiment.remote`) share: the results folder, the summary, signals and exit
codes.

Exit codes: 0 a stop criterion was met; 1 training failed (one error line, details in the
logs); 2 bad input; 130 interrupted by SIGINT; 143 interrupted by SIGTERM. On the first
signal the current iteration gets :data:`ITERATION_GRACE_S` to finish, then a final
checkpoint is written, results are flushed and every actor is stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actorrl.algorithms import AlgorithmSpec, Trainer, algorithm_names, get_algorithm
from actorrl.algorithms.checkpoints import (
    BackgroundWriter,
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from actorrl.algorithms.restarts import RestartPolicy, describe_failure
from actorrl.algorithms.run_loop import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    FINISHED,
    INTERRUPTED,
    CheckpointPolicy,
    Interrupted,
    RunOutcome,
    StopRequest,
    Trainable,
    run_trainer,
)
from actorrl.algorithms.stop import (
    DEFAULT_STOP_TIME_S,
    REWARD_KEY,
    TIME_TOTAL_KEY,
    TIMESTEPS_KEY,
    StopCriteria,
    default_stop_reward,
)
from actorrl.algorithms.tuned import rllib_baseline
from actorrl.config.algorithm import AlgorithmConfig, config_fields, load_config
from actorrl.config.aliases import RLlibKeyWarning, resolve_rllib_keys
from actorrl.config.files import parse_override, read_config_file
from actorrl.config.sections import ConfigError
from actorrl.envs import make_env
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.progress import ProgressDisplay
from actorrl.experiment.recovery import RecoveringTrainer, is_recoverable
from actorrl.experiment.results import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    ResultWriter,
    RunDirectory,
)
from actorrl.experiment.retention import SCORE_KEY, Retention
from actorrl.experiment.signals import exit_code_for
from actorrl.experiment.trackers import RunInfo, TrackerSet, TrackerSettings, tracker_settings
from actorrl.runtime import Driver
from actorrl.runtime.sessions import make_session_dir
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

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
    checkpoint_every: int | None
    """Iterations between checkpoints (0: only the final one; None: by time,
    :attr:`checkpoint_interval_s`)."""
    restore_from: Path | None = None
    restore_state: dict[str, Any] | None = field(default=None, repr=False)
    debug: bool = False
    command: tuple[str, ...] = ()
    serial: bool = False
    """Run every actor in this process and event loop (``--serial``)."""
    start_method: str | None = None
    """How actor processes start (``--start-method``: fork or spawn; None: the default)."""
    trackers: TrackerSettings | None = None
    """W&B / MLflow (``--wandb``, ``--mlflow``, the file's ``logger_config``); see
    :mod:`actorrl.experiment.trackers`."""
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    """When a local run restarts from its last checkpoint after an actor died
    (``--max-failures``, ``--failure-window``, a Tune file's ``max_failures``)."""
    retention: Retention = field(default_factory=Retention)
    """Which checkpoints stay (``--keep-checkpoints``, a Tune file's
    ``keep_checkpoints_num`` and ``checkpoint_score_attr``)."""
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    """Seconds between checkpoints when :attr:`checkpoint_every` is None
    (``--checkpoint-interval``): after the first iteration, then after each iteration that
    ends at least this long after the last checkpoint."""


def checkpoint_policy(plan: TrainPlan, save: Any) -> CheckpointPolicy:
    """When ``plan``'s run checkpoints: every ``checkpoint_every`` iterations when set,
    else every ``checkpoint_interval_s`` seconds of training (and always at the end)."""
    if plan.checkpoint_every is not None:
        return CheckpointPolicy(save=save, every_iterations=plan.checkpoint_every)
    return CheckpointPolicy(save=save, every_s=plan.checkpoint_interval_s)


@dataclass(frozen=True)
class ConfigFile:
    """A ``--config`` file, split into what it says about the run.

    Two layouts are read (YAML or JSON):

    * flat, as ``actorrl submit`` takes it: config keys (RLlib names, ``env`` included) plus
      optional ``algorithm`` (or RLlib's ``run``) and ``stop`` (result key -> threshold);
    * RLlib's tuned-example layout: ``run``/``algorithm``, ``env``, ``stop`` and a ``config``
      mapping of config keys, optionally wrapped in one named experiment
      (``pong-impala: {run: IMPALA, env: ..., config: {...}}``).
    """

    path: str
    values: dict[str, Any]
    """Config keys (``env`` included when the file names one)."""
    algorithm: str | None = None
    """The algorithm the file names (``algorithm`` or ``run``), as written."""
    stop: dict[str, Any] | None = None
    """The file's ``stop`` mapping, when it has one."""
    logger_config: dict[str, Any] | None = None
    """The file's ``logger_config`` (Tune's W&B / MLflow logger settings), top level or in
    RLlib's ``config`` section; see :mod:`actorrl.experiment.trackers`."""
    run_settings: dict[str, Any] = field(default_factory=dict)
    """Tune's experiment settings that ``actorrl train`` honours
    (:data:`RUN_SETTING_KEYS`: checkpoint retention, the failure limit), as written."""
    rllib_defaults: bool = False
    """Whether the keys the file leaves out take RLlib's defaults rather than actorrl's
    CartPole-tuned ones (:data:`~actorrl.algorithms.tuned.RLLIB_DEFAULTS`): true for a file
    that names its algorithm with RLlib's ``run:``, which is written against RLlib's."""


FILE_RUN_KEYS = ("algorithm", "run")
"""Keys naming the algorithm in a config file (actorrl's and RLlib's)."""
EXPERIMENT_KEYS = frozenset({*FILE_RUN_KEYS, "env", "stop", "config", "logger_config"})
"""Top-level keys of RLlib's experiment layout that ``actorrl train`` reads."""
RUN_SETTING_KEYS = ("keep_checkpoints_num", "checkpoint_score_attr", "max_failures")
"""Tune's experiment settings in RLlib's files that ``actorrl train`` honours: the
checkpoints kept (:mod:`actorrl.experiment.retention`) and the failures restarted
(:mod:`actorrl.experiment.recovery`); command-line flags override them."""
IGNORED_EXPERIMENT_KEYS: dict[str, str] = {
    "checkpoint_freq": "actorrl checkpoints every --checkpoint-interval seconds (default 10) "
                       "or every --checkpoint-every iterations, and at the end",
    "checkpoint_at_end": "actorrl always checkpoints at the end",
    "local_dir": "results go to --output (default results/)",
    "storage_path": "results go to --output (default results/)",
    "verbose": "actorrl prints one progress line per iteration",
    # RLlib's release learning tests (release/rllib_tests/learning_tests/yaml_files).
    "frameworks": "RLlib's release-test runner's list of frameworks; actorrl runs torch",
    "pass_criteria": "RLlib's release-test runner's bar; actorrl train stops by 'stop' "
                     "(benchmarks/rllib_learning.py trains to it)",
}
"""Tune's experiment settings beside ``run``/``config`` in RLlib's files (and the keys of its
release learning tests): accepted with one warning line each, naming what actorrl does
instead."""


def read_config_file_sections(path: str) -> ConfigFile:
    """Read ``path`` (see :class:`ConfigFile`); :class:`UsageError` naming the problem."""
    return config_file_sections(path, read_config_file_data(path))


def read_config_file_data(path: str) -> dict[str, Any]:
    """The mapping in the file at ``path``; :class:`UsageError` when it cannot be read."""
    try:
        return read_config_file(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def unwrap_experiment(data: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """RLlib's ``{experiment-name: {run: ..., config: ...}}``: the name and the inner
    mapping; ``(None, data)`` for any other layout."""
    if len(data) == 1:
        (name, inner), = data.items()
        if isinstance(inner, dict) and any(k in inner for k in FILE_RUN_KEYS) \
                and name not in config_keys_of_any_algorithm():
            return str(name), dict(inner)
    return None, data


def config_file_sections(path: str, data: dict[str, Any]) -> ConfigFile:
    """The :class:`ConfigFile` of ``data`` as read from ``path`` (named in errors)."""
    data = dict(unwrap_experiment(data)[1])
    if "job" in data:
        raise UsageError(f"config file {path!r} has a 'job' section, which only "
                         "'actorrl submit' reads; remove it to train locally")
    named = [(key, data.pop(key)) for key in FILE_RUN_KEYS if key in data]
    run_settings = {key: data.pop(key) for key in RUN_SETTING_KEYS if key in data}
    algorithm = None
    if named:
        texts = {str(value).lower() for _, value in named}
        if len(texts) > 1 or not all(isinstance(v, str) and v for _, v in named):
            shown = ", ".join(f"{k}: {v!r}" for k, v in named)
            raise UsageError(f"config file {path!r} names its algorithm ambiguously "
                             f"({shown}); keep one of 'algorithm' or 'run'")
        algorithm = str(named[0][1])
    stop = data.pop("stop", None)
    if stop is not None and not isinstance(stop, dict):
        raise UsageError(f"config file {path!r}: 'stop' must map result keys to numbers "
                         f"(e.g. stop: {{episode_reward_mean: 450}}), got {stop!r}")
    if "config" in data:
        nested = data.pop("config")
        if not isinstance(nested, dict):
            raise UsageError(f"config file {path!r}: 'config' must be a mapping of config "
                             f"keys, got {nested!r}")
        for key in sorted(set(data) & set(IGNORED_EXPERIMENT_KEYS)):
            warnings.warn(f"{key}: {data.pop(key)!r} is ignored: "
                          f"{IGNORED_EXPERIMENT_KEYS[key]}", RLlibKeyWarning, stacklevel=2)
        extra = sorted(set(data) - EXPERIMENT_KEYS)
        if extra:
            raise UsageError(f"config file {path!r} has a 'config' section, so its other "
                             f"top-level keys must be among {sorted(EXPERIMENT_KEYS)}; got "
                             f"{extra} (move config keys into 'config'; actorrl train does "
                             "not read other experiment settings)")
        if "env" in data and "env" in nested and data["env"] != nested["env"]:
            raise UsageError(f"config file {path!r} names two envs: env: {data['env']!r} and "
                             f"config.env: {nested['env']!r}; keep one")
        if "logger_config" in data and "logger_config" in nested:
            raise UsageError(f"config file {path!r} has two logger_config sections (top "
                             "level and in config); keep one")
        data = {**nested, **data}
    logger_config = data.pop("logger_config", None)
    return ConfigFile(path=path, values=data, algorithm=algorithm, stop=stop,
                      logger_config=logger_config, run_settings=run_settings,
                      rllib_defaults=any(key == "run" for key, _ in named))


def config_keys_of_any_algorithm() -> set[str]:
    """Every config key of every algorithm (a flat file's single key is one of these)."""
    keys: set[str] = set()
    for name in algorithm_names():
        keys.update(config_fields(get_algorithm(name).config_cls))
    return keys


def choose_algorithm(cli_algorithm: str | None, file: ConfigFile | None,
                     checkpoint_algorithm: str | None = None,
                     checkpoint_path: str | None = None) -> AlgorithmSpec:
    """The algorithm from the command line, the config file and a restored checkpoint;
    :class:`UsageError` when none names one, a name is unknown, or they disagree."""
    def spec_of(name: str, where: str) -> AlgorithmSpec:
        try:
            return get_algorithm(name)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}" if where else str(exc)) from None

    spec = None
    if cli_algorithm is not None:
        spec = spec_of(cli_algorithm, "")
    if file is not None and file.algorithm is not None:
        named = spec_of(file.algorithm, f"config file {file.path!r}")
        if spec is not None and named.name != spec.name:
            raise UsageError(f"config file {file.path!r} is for algorithm "
                             f"{file.algorithm!r}, not {spec.name!r}; drop ALGO from the "
                             "command line or use a file for it")
        spec = named
    if checkpoint_algorithm is not None:
        named = spec_of(checkpoint_algorithm, f"checkpoint {checkpoint_path!r}")
        if spec is not None and named.name != spec.name:
            raise UsageError(f"checkpoint {checkpoint_path!r} is for algorithm "
                             f"{checkpoint_algorithm!r}, not {spec.name!r}")
        spec = named
    if spec is None:
        raise UsageError("no algorithm given: name one (actorrl train ALGO, one of "
                         f"{', '.join(algorithm_names())}) or put 'algorithm: NAME' (or "
                         "RLlib's 'run: NAME') in the --config file")
    return spec


def merge_sections(values: dict[str, Any], new: Mapping[str, Any],
                   sections: Sequence[str]) -> None:
    """``values.update(new)``, except that a component section (``policy``, ``replay``...)
    given in both is merged key by key: a file that sets ``policy: {lr: ...}`` over a
    restored checkpoint keeps the checkpoint's other policy keys."""
    for key, value in new.items():
        current = values.get(key)
        if key in sections and isinstance(current, Mapping) and isinstance(value, Mapping):
            values[key] = {**current, **value}
        else:
            values[key] = value


def resolve_config(spec: AlgorithmSpec, *, base: dict[str, Any] | None = None,
                   config_file: str | ConfigFile | None = None,
                   overrides: Sequence[str] = (),
                   explicit: dict[str, Any] | None = None) -> AlgorithmConfig:
    """The algorithm's config from (lowest precedence first) its defaults, ``base`` (a
    checkpoint's config), ``config_file`` (a path or a read :class:`ConfigFile`),
    ``overrides`` (``key=value``) and ``explicit`` (command-line flags that were given);
    :class:`UsageError` listing every problem otherwise. A file in RLlib's layout without
    a checkpoint starts from RLlib's defaults (:func:`~actorrl.algorithms.tuned.
    rllib_baseline`), as RLlib would run it."""
    values: dict[str, Any] = dict(base or {})
    if isinstance(config_file, str):
        config_file = read_config_file_sections(config_file)
    if config_file is not None:
        choose_algorithm(spec.name, config_file)  # refuses a file for another algorithm
    try:
        if config_file is not None:
            layer = rllib_layer(spec, config_file.values)
            if config_file.rllib_defaults and base is None:
                values = rllib_baseline(spec.name)
                keep_exploration_defaults(layer, values)
                keep_vision_net_default(layer, values)
            merge_sections(values, layer, spec.config_cls.SECTIONS)
        for text in overrides:
            key, value = parse_override(text)
            values.update(rllib_layer(spec, {key: value}))
        values.update({k: v for k, v in (explicit or {}).items() if v is not None})
        return load_config(spec.config_cls, values)
    except ConfigError as exc:
        where = f" (config file {config_file.path!r})" if config_file is not None else ""
        raise UsageError(f"{exc}{where}") from None


def keep_exploration_defaults(layer: dict[str, Any], baseline: Mapping[str, Any]) -> None:
    """RLlib's merge of a file's ``exploration_config`` into the default one: the file's
    keys over the baseline's, unless the file names another ``type`` (then the file's
    alone), as RLlib's config merge treats that key. ``layer`` is changed in place."""
    default = (baseline.get("policy") or {}).get("exploration_config")
    given = layer.get("exploration_config")
    if isinstance(default, Mapping) and isinstance(given, Mapping) and \
            given.get("type", default.get("type")) == default.get("type"):
        layer["exploration_config"] = {**default, **given}


def keep_vision_net_default(layer: dict[str, Any], baseline: Mapping[str, Any]) -> None:
    """The baseline's ``model.vision_net`` kept under a file's own ``model``, which
    otherwise replaces the baseline's whole: RLlib's files cannot name that key (it is
    actorrl's), so their image encoders stay RLlib's. ``layer`` is changed in place."""
    default = ((baseline.get("policy") or {}).get("model") or {}).get("vision_net")
    given = layer.get("model")
    if default is not None and isinstance(given, Mapping) and "vision_net" not in given:
        layer["model"] = {**given, "vision_net": default}


def rllib_layer(spec: AlgorithmSpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """One layer of input (a file, a ``--set``) with RLlib's other spellings read as
    actorrl's keys (:func:`~actorrl.config.aliases.resolve_rllib_keys`), so that a later
    layer's key overrides an earlier layer's alias of it; :class:`ConfigError` listing the
    problems. Keys whose meaning depends on the env stay for the final load (``--env``
    may still change it)."""
    resolution = resolve_rllib_keys(values, algorithm=spec.name, env_known=False,
                                    settings=set(config_fields(spec.config_cls)))
    if resolution.problems:
        raise ConfigError(f"invalid {spec.config_cls.__name__}:",
                          problems=resolution.problems)
    return resolution.values


def stop_criteria(env: str, file: ConfigFile | None, *, stop_reward: float | None,
                  stop_reward_given: bool, stop_timesteps: int | None,
                  stop_time_s: float | None, stop_time_given: bool) -> StopCriteria:
    """The run's stop criteria: the config file's ``stop`` mapping when it has one (it
    replaces the defaults: 450 on CartPole-v1 and
    :data:`~actorrl.algorithms.stop.DEFAULT_STOP_TIME_S`),
    with each ``--stop-*`` flag given on the command line replacing its criterion."""
    if file is None or file.stop is None:
        reward = stop_reward if stop_reward_given else default_stop_reward(env)
        time_s = stop_time_s if stop_time_given else DEFAULT_STOP_TIME_S
        return StopCriteria.of(reward=reward, timesteps=stop_timesteps,
                               time_s=time_s or None)
    try:
        base = StopCriteria.from_mapping(file.stop)
    except ValueError as exc:
        raise UsageError(f"config file {file.path!r}: {exc}, got {file.stop!r}") from None
    thresholds = dict(base.thresholds)
    if stop_reward_given:
        thresholds.pop(REWARD_KEY, None)
        if stop_reward is not None:
            thresholds[REWARD_KEY] = float(stop_reward)
    if stop_timesteps is not None:
        thresholds[TIMESTEPS_KEY] = int(stop_timesteps)
    time_s = None
    if stop_time_given:
        time_s = stop_time_s or None
        thresholds.pop(TIME_TOTAL_KEY, None)
    return StopCriteria(thresholds=thresholds, time_s=time_s)


def run_settings(file: ConfigFile | None, *, max_failures: int | None,
                 failure_window_s: float | None, failure_window_given: bool,
                 keep_checkpoints: int | None) -> tuple[RestartPolicy, Retention]:
    """The run's restart policy and checkpoint retention: the command line's
    ``--max-failures`` / ``--failure-window`` / ``--keep-checkpoints`` where given (None /
    ``failure_window_given`` false: not given), else the file's Tune settings
    (:data:`RUN_SETTING_KEYS`; ``keep_checkpoints_num: null`` keeps all), else the
    defaults; :class:`UsageError` naming a bad value."""
    settings = dict(file.run_settings) if file is not None else {}
    where = f"config file {file.path!r}: " if file is not None else ""
    defaults = RestartPolicy()
    limit = max_failures if max_failures is not None else settings.get(
        "max_failures", defaults.max_failures)
    window = failure_window_s if failure_window_given else defaults.failure_window_s
    policy = RestartPolicy(max_failures=limit, failure_window_s=window)
    problems = policy.problems("--" if max_failures is not None else "")
    if problems:
        raise UsageError(f"{where if max_failures is None else ''}{problems[0]}")
    keep = keep_checkpoints
    if keep is None and "keep_checkpoints_num" in settings:
        keep = settings["keep_checkpoints_num"] or 0  # Tune's null: keep every one
    try:
        retention = Retention(
            keep=Retention.keep if keep is None else keep,
            score_attr=settings.get("checkpoint_score_attr", Retention.score_attr))
    except ValueError as exc:
        raise UsageError(f"{where}{exc}") from None
    return policy, retention


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


def plan_training(algorithm: str | None, *, env: str | None = None,
                  num_workers: int | None = None,
                  config_file: str | ConfigFile | None = None,
                  overrides: Sequence[str] = (), seed: int | None = None,
                  output_dir: str = "results", checkpoint_every: int | None = None,
                  checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
                  restore: str | None = None, stop_reward: float | None = None,
                  stop_reward_given: bool = False, stop_timesteps: int | None = None,
                  stop_time_s: float | None = DEFAULT_STOP_TIME_S,
                  stop_time_given: bool = True, debug: bool = False,
                  command: Sequence[str] = (), serial: bool = False,
                  start_method: str | None = None, wandb_project: str | None = None,
                  mlflow_uri: str | None = None, max_failures: int | None = None,
                  failure_window_s: float | None = None, failure_window_given: bool = False,
                  keep_checkpoints: int | None = None) -> TrainPlan:
    """Validate all inputs of ``actorrl train`` (see the module docstring).

    ``algorithm`` None takes the algorithm from the config file (``algorithm``/``run``) or
    the restored checkpoint; all that name one must agree. ``stop_reward_given`` false means
    "use the default" (the config file's ``stop``, else 450 for CartPole-v1); ``stop_reward``
    None with it true disables the reward criterion. ``stop_time_given`` false likewise
    means the file's ``stop`` or, without one, ``stop_time_s``. ``config_file`` is a path
    or an already read :class:`ConfigFile` (one trial of a sweep). ``wandb_project`` /
    ``mlflow_uri`` (``--wandb`` / ``--mlflow``) ask for trackers beside the file's
    ``logger_config``. ``checkpoint_every`` (``--checkpoint-every``; None: every
    ``checkpoint_interval_s`` seconds, ``--checkpoint-interval``): see
    :func:`checkpoint_policy`. ``max_failures``, ``failure_window_s`` and ``keep_checkpoints``
    (``--max-failures``, ``--failure-window``, ``--keep-checkpoints``): see
    :func:`run_settings`.
    """
    file = (read_config_file_sections(config_file) if isinstance(config_file, str)
            else config_file)
    restore_from, restore_state, base = None, None, None
    if restore is not None:
        try:
            restore_from, restore_state = read_checkpoint(restore)
        except CheckpointError as exc:  # the user named it: bad input
            raise UsageError(str(exc)) from None
        base = dict(restore_state.get("config") or {})
    spec = choose_algorithm(algorithm, file,
                            restore_state["algorithm"] if restore_state else None,
                            str(restore_from) if restore_from else None)
    config = resolve_config(spec, base=base, config_file=file, overrides=overrides,
                            explicit={"env": env, "num_workers": num_workers, "seed": seed})
    check_env(config)
    if checkpoint_every is not None and checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    if not (checkpoint_interval_s > 0 and math.isfinite(checkpoint_interval_s)):
        raise UsageError(f"--checkpoint-interval must be a number of seconds > 0, got "
                         f"{checkpoint_interval_s} (--checkpoint-every 0 checkpoints only at "
                         "the end)")
    where = (f"config file {file.path!r}: logger_config" if file is not None
             else "logger_config")
    trackers = tracker_settings(file.logger_config if file is not None else None,
                                wandb_project=wandb_project, mlflow_uri=mlflow_uri,
                                where=where)
    stop = stop_criteria(config.env, file, stop_reward=stop_reward,
                         stop_reward_given=stop_reward_given, stop_timesteps=stop_timesteps,
                         stop_time_s=stop_time_s, stop_time_given=stop_time_given)
    policy, retention = run_settings(file, max_failures=max_failures,
                                     failure_window_s=failure_window_s,
                                     failure_window_given=failure_window_given,
                                     keep_checkpoints=keep_checkpoints)
    return TrainPlan(spec=spec, config=config, stop=stop, output_dir=output_dir,
                     checkpoint_every=checkpoint_every, restore_from=restore_from,
                     restore_state=restore_state, debug=debug, command=tuple(command),
                     serial=serial, start_method=start_method, trackers=trackers,
                     restart_policy=policy, retention=retention,
                     checkpoint_interval_s=checkpoint_interval_s)


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
    records: list[tuple[int, float]] = field(default_factory=list, repr=False)
    """(iteration, reward) of each new best, in order: a rollback to an earlier checkpoint
    drops those of the iterations it undid, so the best is that of the current curve."""

    def observe(self, result: dict[str, Any]) -> None:
        """Track counters and the best mean reward from one result (a result that repeats
        an iteration, after a restart from a checkpoint, supersedes the later ones)."""
        self.timesteps_total = int(result.get("timesteps_total", 0))
        self.training_iteration = int(result.get("training_iteration", 0))
        while (self.training_iteration > 0 and self.records
               and self.records[-1][0] >= self.training_iteration):
            self.records.pop()
        reward = result.get("episode_reward_mean")
        if isinstance(reward, (int, float)) and not math.isnan(reward):
            self.last_reward = float(reward)
            if not self.records or reward > self.records[-1][1]:
                self.records.append((self.training_iteration, float(reward)))
        if self.records:
            self.best_iteration, self.best_reward = self.records[-1]
        else:
            self.best_iteration, self.best_reward = None, None

    def as_status(self) -> dict[str, Any]:
        """Fields for ``run.json``."""
        return {"status": self.status, "exit_code": self.exit_code,
                "stop_reason": self.stop_reason, "error": self.error,
                "best_reward": self.best_reward, "best_iteration": self.best_iteration,
                "last_reward": self.last_reward, "timesteps_total": self.timesteps_total,
                "training_iteration": self.training_iteration,
                "last_checkpoint": self.last_checkpoint, "wall_time_s": self.wall_time_s}


class TrainingRun:
    """One ``actorrl train`` invocation: the results folder, the summary, signals and exit
    codes around :func:`~actorrl.algorithms.run_loop.run_trainer`. Subclasses say where
    the trainer runs (:meth:`_execute`)."""

    def __init__(self, plan: TrainPlan, run_dir: RunDirectory, display: ProgressDisplay
                 ) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.display = display
        self.summary = RunSummary()
        self.stop_signal: int | None = None
        self.stop_request = StopRequest()
        self._main: asyncio.Task | None = None
        self._aborted = False
        self._writer: ResultWriter | None = None
        self._trackers = TrackerSet([])
        self.last_result: dict[str, Any] | None = None
        """The latest result (a checkpoint's score is read from it)."""

    # ---- signals ------------------------------------------------------------------------
    def on_signal(self, signum: int, count: int) -> None:
        """First signal: stop after the current iteration (at most ``ITERATION_GRACE_S``),
        checkpoint, shut down. Second: abort at once without a checkpoint."""
        name = signal.Signals(signum).name
        if count == 1:
            self.stop_signal = signum
            self.display.note(f"{name} received: stopping after this iteration and writing a "
                              "checkpoint (again: abort without one)")
            self.stop_request.set(name)
        elif count == 2 and self._main is not None and not self._aborted:
            self._aborted = True
            self.display.note(f"{name} received again: aborting; stopping all actors")
            self._main.cancel()

    # ---- the run --------------------------------------------------------------------------
    def status_fields(self) -> dict[str, Any]:
        """What ``run.json`` records about where and how this run trains."""
        return {}

    async def run(self) -> RunSummary:
        """Train until a stop criterion, a signal or a failure; always leaves no actor
        running. Returns the summary (status and exit code set)."""
        self._main = asyncio.current_task()
        plan, run_dir = self.plan, self.run_dir
        run_dir.update_status(**self.summary.as_status(), algorithm=plan.spec.name,
                              env=plan.config.env, command=list(plan.command),
                              started_at=self.summary.started_at,
                              stop_criteria=plan.stop.describe(), **self.status_fields())
        self._writer = ResultWriter(run_dir.path)
        try:
            self._trackers = TrackerSet.open(plan.trackers, RunInfo(
                name=run_dir.path.name, run_dir=run_dir.path,
                config={"algorithm": plan.spec.name, **plan.config.to_dict()},
                group=plan.trackers.group if plan.trackers else None))
            await self._execute()
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
            self._writer.close()
            self._trackers.close(self.summary.status, self.summary.exit_code)
            self.summary.wall_time_s = time.time() - self.summary.started_at
            run_dir.update_status(**self.summary.as_status(), ended_at=time.time())
        return self.summary

    async def _execute(self) -> None:
        raise NotImplementedError

    async def _train(self, trainer: Trainable, title: str, checkpoints: CheckpointPolicy,
                     grace_s: float) -> RunOutcome:
        """The run loop with this run's sinks and signals; sets the summary's status."""
        self.summary.training_started_at = time.time()
        self.display.start(title, self.plan.stop)
        try:
            outcome = await run_trainer(trainer, self.plan.stop, [self._record], checkpoints,
                                        stop_request=self.stop_request, grace_s=grace_s)
        finally:
            self.display.close()
        if outcome.status == FINISHED:
            self._finish(STATUS_FINISHED, 0, outcome.reason)
        elif outcome.status == INTERRUPTED:
            self._finish(STATUS_INTERRUPTED, self._signal_exit_code(), outcome.reason)
        return outcome

    def _record(self, result: dict[str, Any]) -> None:
        assert self._writer is not None
        derived = self._writer.record(result)
        self.last_result = result
        self._trackers.record(result)
        job = result.get("job")
        committed = job.get("checkpoint_iteration") if isinstance(job, dict) else None
        if isinstance(committed, int):  # a cluster job's checkpoint: no rollback undoes it
            self._trackers.commit(committed)
        self.summary.observe(result)
        self.display.update(result, derived, self.summary.best_reward)

    def _signal_exit_code(self) -> int:
        return exit_code_for(self.stop_signal or signal.SIGINT)

    def _finish(self, status: str, exit_code: int, reason: str) -> None:
        self.summary.status, self.summary.exit_code = status, exit_code
        if reason:
            self.summary.stop_reason = reason

    def _note_checkpoint(self, path: str) -> None:
        self.summary.last_checkpoint = path
        self.run_dir.update_status(last_checkpoint=path)
        self._trackers.checkpoint(path)
        self.display.note(f"checkpoint {path}")


def oversubscription_warning(config: AlgorithmConfig, cores: int | None = None
                             ) -> str | None:
    """The warning for a local run that asks for more rollout workers than this machine
    has cores (None when it does not). The local node places every actor anyway (it never
    waits for free CPUs), so such a run starts, oversubscribed."""
    cores = cores or os.cpu_count() or 1
    if config.num_workers <= cores:
        return None
    return (f"num_workers={config.num_workers} asks for more rollout workers than this "
            f"machine's {cores} cores: starting anyway, oversubscribed (the workers and the "
            f"learner share the {cores} cores, so each runs slower); for at most one worker "
            f"per core use --set num_workers={cores}")


def without_missing_gpus(plan: TrainPlan, gpus: float | None = None) -> TrainPlan:
    """``plan`` for a local run on a machine without CUDA GPUs (``gpus``: how many it has,
    default :func:`~actorrl.runtime.node.resources.count_gpus`): a config asking for GPUs gets
    its learner on the CPU (``num_gpus: 0``), with one
    :class:`~actorrl.config.aliases.RLlibKeyWarning` line, as RLlib's files with
    ``num_gpus: 1`` are often run on laptops. N towers compute what one device does on
    the whole batch, so only speed differs. A machine with some GPUs is left to the
    learner's own check (it names the GPUs it lacks)."""
    from actorrl.config.aliases import RLlibKeyWarning
    from actorrl.runtime.node.resources import count_gpus

    config = plan.config
    asked = config.num_gpus
    if asked <= 0 or config._fake_gpus or (count_gpus() if gpus is None else gpus) > 0:
        return plan
    warnings.warn(f"num_gpus: {asked:g} asks for CUDA GPUs, and this machine has none: the "
                  "learner runs on the CPU (num_gpus: 0); it computes the same, slower "
                  "(--set num_gpus=0 silences this)", RLlibKeyWarning, stacklevel=2)
    return dataclasses.replace(plan, config=config.replace(num_gpus=0))


class LocalRun(TrainingRun):
    """A training run on an embedded local cluster in this process.

    A checkpoint pauses training only while the trainer's state is copied
    (:meth:`Trainer.get_state`); the write to disk, the retention's pruning and ``run.json``'s
    ``last_checkpoint`` follow in the background (:class:`BackgroundWriter`: one write at a
    time, the newest state winning). A restart after an actor died restores the newest
    copy, written or not yet. ``checkpoint_pauses_s`` keeps how long each checkpoint held
    training up."""

    def __init__(self, plan: TrainPlan, run_dir: RunDirectory, display: ProgressDisplay
                 ) -> None:
        super().__init__(plan, run_dir, display)
        self.checkpoint_writer = BackgroundWriter()
        self.checkpoint_pauses_s: list[float] = []
        """Seconds training waited for each checkpoint (the state's copy)."""
        self._latest_state: dict[str, Any] | None = None
        """The newest checkpoint state copied (on disk, or being written)."""

    def status_fields(self) -> dict[str, Any]:
        """The driver's pid and the restored checkpoint."""
        restored = self.plan.restore_from
        return {"pid": os.getpid(), "restored_from": str(restored) if restored else None,
                "serial": self.plan.serial}

    async def _execute(self) -> None:
        # Sockets live in a short temporary folder (ipc paths are limited to ~107 bytes);
        # actor logs go straight to the results folder through a symlink.
        session_dir = make_session_dir()
        os.symlink(self.run_dir.logs_dir.resolve(), os.path.join(session_dir, "logs"))
        try:
            async with Driver.start(session_dir=session_dir, serial=self.plan.serial,
                                    start_method=self.plan.start_method) as driver:
                await self._run_trainer(driver)
        finally:
            shutil.rmtree(session_dir, ignore_errors=True)

    async def _run_trainer(self, driver: Driver) -> None:
        plan = self.plan
        mode = f"num_workers={plan.config.num_workers}" + (", serial" if plan.serial else "")
        self.display.note(f"starting {plan.spec.name} on {plan.config.env} ({mode}); results "
                          f"in {self.run_dir.path}")
        crowded = None if plan.serial else oversubscription_warning(plan.config)
        if crowded:
            log.warning(crowded)
        try:
            trainer = await self.stop_request.guard(Trainer.create(
                plan.spec, plan.config, driver, results_dir=self.run_dir.path))
        except Interrupted:
            self._finish(STATUS_INTERRUPTED, self._signal_exit_code(),
                         "interrupted while starting")
            return
        recovering = RecoveringTrainer(
            trainer, rebuild=lambda survivors: Trainer.create(
                plan.spec, plan.config, driver, results_dir=self.run_dir.path,
                survivors=survivors),
            state=self._restart_state, policy=plan.restart_policy,
            notify=self._note_restart)
        try:
            if plan.restore_state is not None:
                await trainer.set_state(plan.restore_state)
                self.display.note(f"restored {plan.restore_from} (iteration "
                                  f"{trainer.iteration}, timesteps "
                                  f"{plan.restore_state['timesteps_total']:,})")

            async def save(final: bool) -> None:
                live = recovering.trainer
                if live is None:  # interrupted while a restart built the next trainer
                    log.warning("no final checkpoint: the run was restarting")
                    return
                try:
                    await self._checkpoint(live, final)
                except Exception as exc:
                    if not is_recoverable(exc):
                        raise
                    # An actor died while its state was fetched: the next iteration
                    # fails the same way and restarts from the last checkpoint written.
                    self._note_restart(f"checkpoint skipped: {describe_failure(exc)}")

            policy = checkpoint_policy(plan, save)
            await self._train(recovering, f"{plan.spec.name} on {plan.config.env}", policy,
                              ITERATION_GRACE_S)
            await self.checkpoint_writer.flush()  # the last checkpoint on disk before exit
        finally:
            if not self._aborted:  # an abort leaves the actors to the driver's shutdown
                try:  # a failed run still leaves its newest checkpoint written
                    await self.checkpoint_writer.flush()
                except Exception as exc:
                    log.warning("the last checkpoint was not written: %s",
                                error_summary(exc))
                await recovering.stop()  # the driver's shutdown kills whatever is left

    async def _restart_state(self) -> dict[str, Any] | None:
        """What a restarted trainer restores: the newest checkpoint state of this run
        (copied in memory, whether or not its write has finished), else the last
        checkpoint on disk, else the ``--restore`` checkpoint, else nothing."""
        if self._latest_state is not None:
            return self._latest_state
        path = self.summary.last_checkpoint
        if path is None:
            return self.plan.restore_state
        _, state = await asyncio.to_thread(read_checkpoint, path)
        return state

    def _note_restart(self, text: str) -> None:
        log.warning(text, extra=FILE_ONLY)
        self.display.note(text)

    async def _checkpoint(self, trainer: Trainer, final: bool) -> None:
        """Copy ``trainer``'s state (training waits for this only) and write it in the
        background."""
        started = time.perf_counter()
        state = await wait_for(trainer.get_state(), STATE_TIMEOUT_S)
        metadata = {"algorithm": self.plan.spec.name, "env": self.plan.config.env,
                    "training_iteration": trainer.iteration,
                    "timesteps_total": state["timesteps_total"],
                    "num_steps_trained": state["num_steps_trained"],
                    "episode_reward_mean": self.summary.last_reward,
                    "best_reward": self.summary.best_reward, "final": final,
                    SCORE_KEY: self.plan.retention.score_of(self.last_result)}
        self._latest_state = state
        checkpoints_dir, retention = self.run_dir.checkpoints_dir, self.plan.retention

        def write() -> tuple[Path, Path | None]:  # in the writer's thread
            path = write_checkpoint(checkpoints_dir, state, metadata)
            retention.prune(checkpoints_dir)
            return path, retention.best(checkpoints_dir)

        def written(paths: tuple[Path, Path | None]) -> None:  # back on the loop
            path, best = paths
            self._note_checkpoint(str(path))
            self.run_dir.update_status(best_checkpoint=str(best) if best else None)

        self.checkpoint_writer.submit(write, written)
        pause = time.perf_counter() - started
        self.checkpoint_pauses_s.append(pause)
        log.debug("checkpoint of iteration %d: training paused %.3f s (state copied); "
                  "written in the background", trainer.iteration, pause)


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
