"""The ``actorrl`` command.

::

    actorrl train [ALGO] [--env ENV] [--num-workers N] [--config FILE] [--set KEY=VALUE ...]
                       [--seed N] [--output DIR] [--checkpoint-interval S | --checkpoint-every N]
                       [--restore PATH]
                       [--keep-checkpoints N] [--max-failures N|none] [--failure-window S|none]
                       [--stop-reward R|none] [--stop-timesteps N] [--stop-time S|none]
                       [--address ADDR [--keys DIR] | --serial] [--progress auto|rich|plain]
                       [--start-method fork|spawn] [--concurrent-trials N] [--debug]
                       [--wandb PROJECT] [--mlflow URI]
    actorrl evaluate CHECKPOINT [--episodes N] [--render no|human] [--video DIR] [--env ENV]
                                [--seed N] [--json] [--debug]
    actorrl plot RESULTS_DIR_OR_CSV [...] [-o OUT.png] [--title TEXT]
    actorrl export RUN|CHECKPOINT --format onnx|torchscript|safetensors [-o FILE] [--debug]

plus the cluster commands of :mod:`actorrl.cli.cluster` when that module is present (its
``register(subparsers)`` adds subparsers that set ``func=handler(args) -> int``).

``ALGO`` may be left out when the ``--config`` file names the algorithm (``algorithm:`` or
RLlib's ``run:``) or when ``--restore`` gives a checkpoint; all that name one must agree. A
config file's ``stop:`` mapping replaces the default stop criteria; ``--stop-*`` flags
given on the command line replace single criteria of it (see
:func:`actorrl.experiment.train.stop_criteria`).

Exit codes: 0 success (a stop criterion met); 1 a failure while running (one error line;
``--debug`` for the traceback); 2 bad input (unknown algorithm, env or config key, wrong
value type, malformed ``--set``, missing file), reported before anything starts;
130 interrupted by SIGINT; 143 interrupted by SIGTERM. A sweep (a ``--config`` file with
``grid_search`` or ``num_samples``, :mod:`actorrl.experiment.sweep`) exits 0 when every
trial finished, else with the code of the first trial (in trial order) that did not.

Heavy modules (numpy, torch, the runtime) are imported inside the commands: ``train``
(local or ``--address``) blocks SIGINT/SIGTERM
(:class:`~actorrl.experiment.signals.SignalWatcher`) before anything can start a thread.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import actorrl
from actorrl.algorithms.run_loop import DEFAULT_CHECKPOINT_INTERVAL_S
from actorrl.algorithms.stop import DEFAULT_STOP_TIME_S
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.signals import SignalExit, SignalWatcher, exit_code_for

if TYPE_CHECKING:
    from actorrl.experiment.progress import ProgressDisplay
    from actorrl.experiment.results import RunDirectory
    from actorrl.experiment.sweep import Sweep
    from actorrl.experiment.train import RunSummary, TrainingRun, TrainPlan

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
STOP_TIME_DEFAULT = object()
"""``--stop-time`` not given: the config file's ``stop`` mapping, else the default (an
object, not a string, so argparse does not parse it)."""
ALGORITHMS_HELP = "apex, dqn, a3c, impala, appo, ppo, a2c, sac, ddpg, td3, apex_ddpg"


# ---- argument types ------------------------------------------------------------------
def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def _max_failures(text: str) -> int:
    """An integer >= 0, or ``none`` / ``-1`` (no limit: -1)."""
    if text.strip().lower() in ("none", "unlimited", "-1"):
        return -1
    return _int_at_least(0)(text)


def _failure_window(text: str) -> float | None:
    """Seconds > 0, or ``none`` (failures counted since the start: None)."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'none', got {text!r}"
                                         ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds (or 'none'), got {text}")
    return value


_NOT_GIVEN = object()
"""A flag's default when "not given" must differ from every value it takes."""


def _stop_reward(text: str) -> float | str | None:
    """A number, ``none`` (no reward criterion) or ``auto`` (450 on CartPole-v1)."""
    lowered = text.strip().lower()
    if lowered in ("auto", "default"):
        return "auto"
    if lowered in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, 'none' or 'auto', got {text!r}"
                                         ) from None


def _seconds_above_zero(text: str) -> float:
    """A number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _stop_time(text: str) -> float | None:
    """Seconds, or ``none``/``0`` for no time limit."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    return value or None


# ---- parser ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The full parser, cluster commands included when available."""
    parser = argparse.ArgumentParser(
        prog="actorrl",
        description="Distributed RL (Ape-X, A3C, IMPALA, A2C) on a small asyncio + ZeroMQ "
                    "actor runtime.")
    parser.add_argument("--version", action="version", version=f"actorrl {actorrl.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(subparsers)
    _add_evaluate(subparsers)
    _add_plot(subparsers)
    _add_export(subparsers)
    _register_cluster(subparsers)
    return parser


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train an algorithm until a stop criterion",
        description="Train ALGO on an embedded local cluster (or on a coordinator with "
                    "--address) until a stop criterion; writes a results folder. Config "
                    "precedence: algorithm defaults < --restore checkpoint < --config < "
                    "--set < --env/--num-workers/--seed.")
    p.add_argument("algorithm", metavar="ALGO", nargs="?",
                   help=f"one of {ALGORITHMS_HELP}; optional when the --config file names "
                        "it ('algorithm:' or 'run:') or --restore gives a checkpoint")
    p.add_argument("--env", help="gymnasium id or 'pkg.module:factory' (default: the "
                                 "algorithm's, CartPole-v1)")
    p.add_argument("--num-workers", type=_int_at_least(0), help="rollout worker processes")
    p.add_argument("--config", dest="config_file", metavar="FILE",
                   help="YAML or JSON file of config keys (RLlib names), optionally with "
                        "'algorithm' (or 'run'), 'env' and a 'stop' mapping (result key -> "
                        "threshold; replaces the default stop criteria); RLlib's tuned-"
                        "example layout (run/env/stop/config) is read too; see examples/")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one config key; the value is parsed "
                   "as JSON when it can be (repeatable)")
    p.add_argument("--seed", type=int, help="seed for envs and torch")
    p.add_argument("--output", default="results", metavar="DIR",
                   help="parent of the results folder (default: ./results)")
    p.add_argument("--checkpoint-interval", type=_seconds_above_zero, metavar="S",
                   default=DEFAULT_CHECKPOINT_INTERVAL_S,
                   help="checkpoint after the first iteration, then after each iteration "
                        "ending S seconds or more after the last checkpoint, so that a "
                        "learner loss rolls back at most about S seconds of training; the "
                        "state is copied and written in the background, training pauses "
                        f"only for the copy (default: {DEFAULT_CHECKPOINT_INTERVAL_S:g} s)")
    p.add_argument("--checkpoint-every", type=_int_at_least(0), default=None, metavar="N",
                   help="checkpoint every N iterations instead, 0: only at the end "
                        "(default: by time, --checkpoint-interval)")
    p.add_argument("--keep-checkpoints", type=_int_at_least(0), default=None, metavar="N",
                   help="keep the newest N checkpoints and the best by episode_reward_mean "
                        "(a Tune file's checkpoint_score_attr); 0 keeps all (default: a "
                        "Tune file's keep_checkpoints_num, else 5)")
    p.add_argument("--max-failures", type=_max_failures, default=None, metavar="N",
                   help="restart from the last checkpoint when an actor the pipeline "
                        "cannot replace (the learner) dies, at most N times per "
                        "--failure-window; 0: fail at once, 'none': no limit (default: a "
                        "Tune file's max_failures, else 20)")
    p.add_argument("--failure-window", type=_failure_window, default=_NOT_GIVEN,
                   metavar="S", help="the sliding window --max-failures counts in, in "
                   "seconds; 'none': since the start (default: 3600)")
    p.add_argument("--restore", metavar="CHECKPOINT",
                   help="continue from a checkpoint folder (or a results folder's latest); "
                        "its config is the base config and its counters continue")
    p.add_argument("--stop-reward", type=_stop_reward, default="auto", metavar="R",
                   help="stop at episode_reward_mean >= R; 'none' disables (default: 450 "
                        "on CartPole-v1, none otherwise)")
    p.add_argument("--stop-timesteps", type=_int_at_least(1), metavar="N",
                   help="stop at timesteps_total >= N (counted from a restored checkpoint)")
    p.add_argument("--stop-time", type=_stop_time, default=STOP_TIME_DEFAULT,
                   metavar="S", help="stop after S seconds of training in this invocation; "
                   f"'none' or 0 disables (default: {DEFAULT_STOP_TIME_S:g} unless the "
                   "--config file has a 'stop' mapping)")
    p.add_argument("--address", help="run on an existing coordinator (actorrl.cluster.client) "
                                     "instead of a local embedded cluster")
    p.add_argument("--keys", metavar="DIR",
                   help="with --address: CURVE key folder (default: $ACTORRL_KEYS_DIR)")
    p.add_argument("--serial", action="store_true",
                   help="run every actor (workers, learner, replay shards) in this process "
                        "and event loop, with the same pipelines: breakpoints and stack "
                        "traces span the whole step; no child process is started")
    p.add_argument("--start-method", choices=("fork", "spawn"), default=None,
                   help="how actor processes start: forked from a fork server that "
                        "imported torch once (default where available), or each a fresh "
                        "interpreter (default: $ACTORRL_START_METHOD, else fork)")
    p.add_argument("--concurrent-trials", type=_int_at_least(1), default=None, metavar="N",
                   help="for a sweep (a --config file with grid_search or num_samples): run "
                        "N trials at once, each on its own local cluster (or as N jobs "
                        "with --address); default 1, one after another")
    p.add_argument("--progress", choices=("auto", "rich", "plain"), default="auto",
                   help="live display: rich on a terminal, one line per iteration "
                        "otherwise (default: auto)")
    p.add_argument("--wandb", metavar="PROJECT",
                   help="also log results, config and checkpoints to this Weights & Biases "
                        "project (WANDB_MODE=offline: no network); needs the wandb extra")
    p.add_argument("--mlflow", metavar="URI",
                   help="also log results, config and checkpoints to MLflow at URI: a "
                        "folder (a local file store, e.g. ./mlruns), sqlite:///FILE or "
                        "http://HOST:PORT; needs the mlflow extra")
    p.add_argument("--debug", action="store_true",
                   help="print tracebacks and all log messages")
    p.set_defaults(func=_cmd_train)


def _add_evaluate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "evaluate", help="roll out a checkpoint's greedy policy",
        description="Load a checkpoint in this process and run its policy greedily "
                    "(explore=False); prints the mean and std of the episode returns.")
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoint folder, or a results folder (its latest checkpoint)")
    p.add_argument("--episodes", type=_int_at_least(1), default=10, metavar="N",
                   help="episodes to run (default: 10)")
    p.add_argument("--render", choices=("no", "human"), default="no",
                   help="render the env on screen (default: no)")
    p.add_argument("--video", metavar="DIR",
                   help="record every episode to DIR/episode-<k>.mp4 (rgb_array frames, "
                        "gymnasium's RecordVideo; needs the video extra)")
    p.add_argument("--env", help="evaluate on this env instead of the checkpoint's")
    p.add_argument("--seed", type=int, help="seed episode k with SEED + k")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--debug", action="store_true", help="print tracebacks")
    p.set_defaults(func=_cmd_evaluate)


def _add_plot(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot", help="draw learning curves to a PNG",
        description="Plot episode_reward_mean against timesteps and wall time for one or "
                    "more results folders (a parent folder stands for the runs in it) or "
                    "learning-curve CSVs written by benchmarks/learning.py.")
    p.add_argument("run_dirs", nargs="+", metavar="RESULTS_DIR_OR_CSV")
    p.add_argument("-o", "--output", metavar="OUT.png",
                   help="output file (default: RESULTS_DIR/learning_curves.png for one run, "
                        "./learning_curves.png for several)")
    p.add_argument("--title", help="figure title")
    p.add_argument("--debug", action="store_true", help="print tracebacks")
    p.set_defaults(func=_cmd_plot)


def _add_export(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a checkpoint's greedy policy as ONNX, TorchScript or "
                       "safetensors",
        description="Export the policy of a checkpoint (or a results folder's latest) for "
                    "use without actorrl: ONNX and TorchScript hold the whole greedy "
                    "policy (observation filter, model, argmax) with a dynamic batch axis; "
                    "safetensors holds the model's weights and a JSON description.")
    p.add_argument("checkpoint", metavar="RUN|CHECKPOINT",
                   help="a checkpoint folder, or a results folder (its latest checkpoint)")
    p.add_argument("--format", required=True, choices=("onnx", "torchscript", "safetensors"),
                   help="onnx (needs the onnx extra), torchscript, or safetensors (needs "
                        "the safetensors extra)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write (default: CHECKPOINT/policy.onnx, .pt or "
                        ".safetensors)")
    p.add_argument("--debug", action="store_true", help="print tracebacks")
    p.set_defaults(func=_cmd_export)


def _register_cluster(subparsers: argparse._SubParsersAction) -> None:
    """Add the cluster commands when :mod:`actorrl.cli.cluster` is installed."""
    try:
        cli_cluster = importlib.import_module("actorrl.cli.cluster")
    except ImportError as exc:
        if exc.name not in ("actorrl.cli.cluster", None):
            print(f"actorrl: warning: cluster commands unavailable: {exc}", file=sys.stderr)
        return
    cli_cluster.register(subparsers)


# ---- commands ----------------------------------------------------------------------------
def _cmd_train(args: argparse.Namespace) -> int:
    from actorrl.experiment.sweep import read_sweep

    sweep = read_sweep(args.config_file, args.seed) if args.config_file else None
    if sweep is not None:
        return _train_sweep(sweep, args)
    if args.concurrent_trials is not None:
        raise UsageError("--concurrent-trials applies to sweeps only: put 'grid_search' or "
                         "'num_samples' in the --config file, or drop the flag")
    plan = _plan(args, args.config_file, args.seed)
    if args.address:
        _check_remote_flags(args)
        return _train_remote(plan, args)
    return _train_local(plan, args)


def _plan(args: argparse.Namespace, config_file: object, seed: int | None) -> TrainPlan:
    """The validated plan of one run (a trial's :class:`ConfigFile` or the file's path)."""
    from actorrl.experiment.train import plan_training, without_missing_gpus

    with _rllib_key_warnings(args):
        plan = plan_training(
            args.algorithm, env=args.env, num_workers=args.num_workers,
            config_file=config_file, overrides=args.overrides, seed=seed,
            output_dir=args.output, checkpoint_every=args.checkpoint_every,
            checkpoint_interval_s=args.checkpoint_interval,
            restore=args.restore,
            stop_reward=None if args.stop_reward == "auto" else args.stop_reward,
            stop_reward_given=args.stop_reward != "auto", stop_timesteps=args.stop_timesteps,
            stop_time_s=None if args.stop_time is STOP_TIME_DEFAULT else args.stop_time,
            stop_time_given=args.stop_time is not STOP_TIME_DEFAULT, debug=args.debug,
            command=["actorrl", *args.argv], serial=args.serial,
            start_method=args.start_method, wandb_project=args.wandb,
            mlflow_uri=args.mlflow, max_failures=args.max_failures,
            failure_window_s=(None if args.failure_window is _NOT_GIVEN
                              else args.failure_window),
            failure_window_given=args.failure_window is not _NOT_GIVEN,
            keep_checkpoints=args.keep_checkpoints)
        return plan if args.address else without_missing_gpus(plan)


def _check_remote_flags(args: argparse.Namespace) -> None:
    """Refuse flags that only apply to local training."""
    if args.restore:
        raise UsageError("--restore works with local training only; on a cluster, "
                         "jobs resume from their own checkpoints")
    if args.serial:
        raise UsageError("--serial runs locally; it cannot be combined with --address")
    given = [flag for flag, value in (("--max-failures", args.max_failures),
                                      ("--keep-checkpoints", args.keep_checkpoints))
             if value is not None]
    if args.failure_window is not _NOT_GIVEN:
        given.append("--failure-window")
    if given:
        raise UsageError(f"{', '.join(given)} apply to local training; a cluster job takes "
                         "job.max_failures and job.failure_window_s in 'actorrl submit' "
                         "files, and keeps job.keep_checkpoints checkpoints")
    if args.start_method:
        raise UsageError("--start-method applies to local training; on a cluster each "
                         "node chooses (ACTORRL_START_METHOD where it joins)")


def _train_sweep(sweep: Sweep, args: argparse.Namespace) -> int:
    """Plan every trial (refusing the sweep on the first bad one), then run them into one
    sweep folder; print and write the summary; the exit code of
    :func:`~actorrl.experiment.sweep.sweep_exit_code`."""
    from actorrl.experiment.sweep import TrialOutcome, create_sweep_dir, trial_label
    from actorrl.experiment.train import config_file_sections

    if args.restore:
        raise UsageError(f"--restore cannot be combined with a sweep ({sweep.path!r} has "
                         "grid_search or num_samples): restore one trial's results folder "
                         "with a config file without grids")
    if args.address:
        _check_remote_flags(args)
    total = len(sweep.trials)
    plans: list[TrainPlan] = []
    for trial in sweep.trials:
        label = trial_label(trial, sweep) or "(no grid values)"
        try:
            file = config_file_sections(sweep.path, trial.data)
            plans.append(_plan(args, file, trial.seed))
        except UsageError as exc:
            raise UsageError(f"sweep trial {trial.index + 1}/{total} ({label}) is invalid, "
                             f"so no trial was started: {exc}") from None
    client_class = None
    if args.address:
        from actorrl.experiment.remote import connect_client, load_client_class

        client_class = load_client_class()
        # First contact before anything is written (as for a single --address run).
        connect_client(client_class, args.address, _keys_dir(args)).close()
    try:
        sweep_dir = create_sweep_dir(args.output, sweep.name)
    except OSError as exc:
        raise UsageError(f"cannot create a sweep folder under {args.output!r}: "
                         f"{exc.strerror or exc}") from None
    outcomes = [TrialOutcome(trial=t, label=trial_label(t, sweep)) for t in sweep.trials]
    return _run_sweep(sweep, plans, outcomes, sweep_dir, client_class, args)


def _keys_dir(args: argparse.Namespace) -> str | None:
    keys = args.keys or os.environ.get("ACTORRL_KEYS_DIR")
    return os.path.expanduser(keys) if keys else None


def _run_sweep(sweep: Sweep, plans: list[TrainPlan], outcomes: list, sweep_dir: Path,
               client_class: type | None, args: argparse.Namespace) -> int:
    from actorrl.experiment.progress import make_progress
    from actorrl.experiment.sweep import (
        SUMMARY_FILE,
        SweepRunner,
        create_trial_dir,
        format_table,
        sweep_exit_code,
        trial_folder_name,
        write_summary,
    )
    from actorrl.experiment.train import LocalRun, configure_logging
    from transport.sockets import new_event_loop

    configure_logging(sweep_dir / "driver.log", args.debug)
    concurrency = args.concurrent_trials or 1
    total = len(plans)
    print(f"sweep {sweep.name}: {total} trials ({concurrency} at once); results in "
          f"{sweep_dir}", flush=True)

    def start(index: int) -> TrainingRun:
        plan, trial = plans[index], sweep.trials[index]
        if plan.trackers is not None:  # the trials are one tracker run each, grouped
            plan = dataclasses.replace(plan, trackers=plan.trackers.grouped(sweep_dir.name))
        run_dir = create_trial_dir(sweep_dir, trial_folder_name(
            trial, sweep, plan.spec.name, plan.config.env))
        run_dir.write_config({"algorithm": plan.spec.name, **plan.config.to_dict()})
        print(f"trial {index + 1}/{total} ({outcomes[index].label}): starting in "
              f"{run_dir.path}", flush=True)
        display = make_progress(args.progress if concurrency == 1 else "plain")
        if client_class is None:
            return LocalRun(plan, run_dir, display)
        from actorrl.experiment.remote import RemoteRun, connect_client

        client = connect_client(client_class, args.address, _keys_dir(args))
        client.on_connection = connection_notes(display)
        return RemoteRun(plan, run_dir, display, address=args.address, client=client)

    def report(outcome: Any, run: Any) -> None:
        index = outcome.trial.index
        best = "-" if outcome.best_reward is None else f"{outcome.best_reward:.1f}"
        print(f"trial {index + 1}/{total} ({outcome.label}): {outcome.status}, best "
              f"episode_reward_mean {best}, {outcome.timesteps_total:,} timesteps, "
              f"{outcome.time_s:.1f} s", flush=True)
        if outcome.error:
            where = f" (logs: {run.run_dir.logs_dir})" if run is not None else ""
            print(f"actorrl train: error: trial {index + 1}/{total} failed: {outcome.error}"
                  f"{where}", file=sys.stderr, flush=True)

    runner = SweepRunner(sweep, outcomes, start, concurrency, report)
    loop = new_event_loop()
    watcher: SignalWatcher | None = args.signal_watcher
    if watcher is not None:
        watcher.attach(loop, runner.on_signal)
    try:
        loop.run_until_complete(runner.run())
    finally:
        # Written while signals still go to the runner, so a late Ctrl-C cannot skip it.
        write_summary(sweep_dir / SUMMARY_FILE, sweep, outcomes)
        if watcher is not None:
            watcher.detach()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        print(f"\nsweep {sweep.name}: {sweep_dir}\n{format_table(sweep, outcomes)}\n"
              f"summary: {sweep_dir / SUMMARY_FILE}", flush=True)
    return sweep_exit_code(outcomes)


@contextlib.contextmanager
def _rllib_key_warnings(args: argparse.Namespace) -> Iterator[None]:
    """Catch the warnings of planning a run; on leaving (also with an error) print each
    ignored RLlib key's and retired env id's warning as one line and show any other as
    Python would."""
    from actorrl.config.aliases import RLlibKeyWarning
    from actorrl.envs.retired import RetiredEnvIdWarning

    one_line = (RLlibKeyWarning, RetiredEnvIdWarning)
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RLlibKeyWarning)
            yield
    finally:
        shown: set[str] = getattr(args, "shown_warnings", set())
        args.shown_warnings = shown  # a sweep plans every trial: each warning once
        for warning in caught:
            if issubclass(warning.category, one_line):
                if str(warning.message) not in shown:
                    shown.add(str(warning.message))
                    print(f"{_prog(args)}: warning: {warning.message}", file=sys.stderr)
            else:
                warnings.showwarning(warning.message, warning.category, warning.filename,
                                     warning.lineno)


def _create_run_dir(plan: TrainPlan) -> RunDirectory:
    from actorrl.experiment.results import RunDirectory

    try:
        run_dir = RunDirectory.create(plan.output_dir, plan.spec.name, plan.config.env)
    except OSError as exc:
        raise UsageError(f"cannot create a results folder under {plan.output_dir!r}: "
                         f"{exc.strerror or exc}") from None
    run_dir.write_config({"algorithm": plan.spec.name, **plan.config.to_dict()})
    return run_dir


def _train_local(plan: TrainPlan, args: argparse.Namespace) -> int:
    from actorrl.experiment.train import LocalRun

    run_dir = _create_run_dir(plan)
    return _run(LocalRun(plan, run_dir, _start_display(plan, args, run_dir)), args)


def _train_remote(plan: TrainPlan, args: argparse.Namespace) -> int:
    from actorrl.experiment.remote import RemoteRun, connect_client, load_client_class

    client_class = load_client_class()
    # The first contact before anything is written: no results folder for a run that
    # never reached its coordinator.
    client = connect_client(client_class, args.address, _keys_dir(args))
    try:
        run_dir = _create_run_dir(plan)
        display = _start_display(plan, args, run_dir)
        client.on_connection = connection_notes(display)
        run = RemoteRun(plan, run_dir, display, address=args.address, client=client)
    except BaseException:
        client.close()
        raise
    return _run(run, args)


def connection_notes(display: ProgressDisplay) -> Callable[[str], None]:
    """Where ``train --address`` reports its job's coordinator going away and coming back
    (:meth:`Job.results <actorrl.cluster.client.Job.results>` waits for it): one line
    each on the progress display, the first also saying how to stop waiting."""

    def note(line: str) -> None:
        if line.startswith("lost the coordinator"):
            line += (" (a restarted coordinator resumes the job from its last checkpoint); "
                     "Ctrl-C stops waiting and ends this command, and the job then resumes "
                     "without it once its coordinator is back (stop it there with "
                     "`actorrl stop JOB`)")
        display.note(f"actorrl train: {line}")

    return note


def _start_display(plan: TrainPlan, args: argparse.Namespace, run_dir: RunDirectory
                   ) -> ProgressDisplay:
    from actorrl.experiment.progress import make_progress
    from actorrl.experiment.train import configure_logging

    configure_logging(run_dir.logs_dir / "driver.log", plan.debug)
    return make_progress(args.progress)


def _run(run: TrainingRun, args: argparse.Namespace) -> int:
    """Run ``run`` on a new event loop, signals delivered to it; print its report."""
    from transport.sockets import new_event_loop

    loop = new_event_loop()
    watcher: SignalWatcher | None = args.signal_watcher
    if watcher is not None:
        watcher.attach(loop, run.on_signal)
    try:
        summary = loop.run_until_complete(run.run())
    finally:
        if watcher is not None:
            watcher.detach()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return _report(run.plan, summary, run.run_dir)


def _report(plan: TrainPlan, summary: RunSummary, run_dir: RunDirectory) -> int:
    """Print the run's summary (stdout) and its error line (stderr); the exit code."""
    from actorrl.experiment.train import format_summary

    print(format_summary(plan.spec.name, plan.config.env, summary, run_dir.path), flush=True)
    if summary.error:
        hint = "" if plan.debug else "; rerun with --debug for the traceback"
        print(f"actorrl train: error: training failed: {summary.error} (logs: "
              f"{run_dir.logs_dir}{hint})", file=sys.stderr, flush=True)
    return summary.exit_code


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from actorrl.experiment.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(args.checkpoint, args.episodes, env=args.env,
                                 seed=args.seed, render=args.render, video=args.video)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(result.describe())
    return EXIT_OK


def _cmd_plot(args: argparse.Namespace) -> int:
    from actorrl.experiment.plot import plot_runs

    out = plot_runs(args.run_dirs, args.output, title=args.title)
    print(f"wrote {out}")
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from actorrl.experiment.export import export_policy

    out = export_policy(args.checkpoint, args.format, args.output)
    print(f"wrote {out}")
    return EXIT_OK


# ---- entry point -------------------------------------------------------------------------
def _first_command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _trains(argv: Sequence[str]) -> bool:
    return _first_command(argv) == "train"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    watcher = None
    if _trains(argv):
        watcher = SignalWatcher()  # before any import that could start a thread
        watcher.install()
    try:
        return _main(argv, watcher)
    finally:
        if watcher is not None:
            watcher.close()


def _main(argv: list[str], watcher: SignalWatcher | None) -> int:
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        args.argv = argv
        args.signal_watcher = watcher
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{_prog(args)}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return exit_code_for(signal.SIGINT)
    except SignalExit as exc:
        print(f"\n{exc}", file=sys.stderr)
        return exit_code_for(exc.signum)
    except Exception as exc:
        debug = bool(getattr(args, "debug", False))
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (rerun with --debug for the traceback)"
        print(f"{_prog(args)}: error: {error_summary(exc)}{hint}", file=sys.stderr)
        return EXIT_FAILED


def _prog(args: argparse.Namespace | None) -> str:
    command = getattr(args, "command", None)
    return f"actorrl {command}" if command else "actorrl"


if __name__ == "__main__":
    sys.exit(main())
