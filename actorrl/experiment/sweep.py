"""``actorrl train --config FILE`` with ``grid_search`` or ``num_samples``: a sweep.

A config file turns into a sweep when any value in it, at any depth (``env``, ``lr``,
``model: {fcnet_hiddens: ...}``, inside RLlib's ``config:`` section, ``stop`` too), is
``{grid_search: [v1, v2, ...]}``, or when its top level (RLlib's experiment level) has
``num_samples: N``. The trials are the cartesian product of every ``grid_search`` list,
repeated ``num_samples`` times (:func:`expand_grid`; RLlib's order: repeat k holds every
grid point, the last grid key varies fastest). When a seed is set (``--seed`` or the
file's ``seed``), repeat k trains with ``seed + k``.

Every trial's config is planned and validated (:func:`~actorrl.experiment.train.
plan_training`) before any starts: a bad value in one grid point refuses the whole sweep,
naming the trial. The trials then run one after another (or ``--concurrent-trials N`` at
once, each on its own embedded local cluster, or as jobs on a coordinator with
``--address``), each into its own results folder under one sweep folder::

    <output>/<experiment>_<YYYY-mm-dd_HH-MM-SS>/
        <algo>_<env>_<key=value...>[_seed=S]/   one results folder per trial
        driver.log                              every trial's driver log
        summary.csv                             one row per trial

Exit code: 0 when every trial finished; otherwise the exit code of the first trial (in
trial order) that did not: 1 failed, 130/143 interrupted. A failed trial does not stop
the sweep; a signal does (the running trials stop cleanly, later ones never start, and the
summary lists what finished).
"""

from __future__ import annotations

import asyncio
import copy
import csv
import datetime
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actorrl.experiment.errors import UsageError
from actorrl.experiment.results import RunDirectory, make_free_folder

GRID_KEY = "grid_search"
NUM_SAMPLES_KEY = "num_samples"
SUMMARY_FILE = "summary.csv"
STATUS_NOT_STARTED = "not started"
MAX_NAME_CHARS = 180
NAME_KEYS_IN_PREFIX = frozenset({"env", "run", "algorithm"})
"""Grid keys already part of a trial folder's ``<algo>_<env>`` prefix."""


@dataclass(frozen=True)
class Trial:
    """One point of a sweep."""

    index: int
    """Position in the sweep, from 0."""
    values: dict[str, Any]
    """This trial's value of each ``grid_search`` key, by dotted path (``model.fcnet_hiddens``;
    RLlib's ``config.`` prefix left out)."""
    sample: int
    """Which of the ``num_samples`` repeats (from 0)."""
    seed: int | None
    """The seed this trial trains with when a seed is set (``seed + sample``), else None."""
    data: dict[str, Any] = field(repr=False)
    """The config file's mapping with this trial's values in place of the grids."""


@dataclass(frozen=True)
class Sweep:
    """A config file's trials."""

    path: str
    name: str
    """The experiment's name (RLlib's layout) or the file's stem."""
    num_samples: int
    grid_keys: list[str]
    trials: list[Trial]


def is_grid(value: Any) -> bool:
    """Whether ``value`` is ``{grid_search: [...]}``."""
    return isinstance(value, Mapping) and GRID_KEY in value


def find_grids(data: Mapping[str, Any], prefix: tuple[str, ...] = ()
               ) -> list[tuple[tuple[str, ...], list[Any]]]:
    """Every ``grid_search`` in ``data`` (nested mappings included), in file order, as
    (key path, values); :class:`UsageError` for a malformed one."""
    found: list[tuple[tuple[str, ...], list[Any]]] = []
    for key, value in data.items():
        path = (*prefix, str(key))
        if is_grid(value):
            dotted = ".".join(path)
            if len(value) != 1:
                raise UsageError(f"{dotted}: a grid_search mapping holds only the "
                                 f"'grid_search' key, got {sorted(value)}; write "
                                 f"{dotted}: {{grid_search: [v1, v2]}}")
            values = value[GRID_KEY]
            if not isinstance(values, list) or not values:
                raise UsageError(f"{dotted}: grid_search needs a non-empty list of values, "
                                 f"got {values!r}; write {dotted}: {{grid_search: [v1, v2]}}")
            if any(is_grid(v) or (isinstance(v, Mapping) and find_grids(v)) for v in values):
                raise UsageError(f"{dotted}: a grid_search value holds another grid_search; "
                                 "nested grids are not supported, list every combination")
            found.append((path, list(values)))
        elif isinstance(value, Mapping):
            found.extend(find_grids(value, path))
    return found


def _with_value(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy.deepcopy(value)


def _file_seed(data: Mapping[str, Any]) -> int | None:
    """The ``seed`` the mapping sets (top level or RLlib's ``config:`` section)."""
    for holder in (data.get("config"), data):
        if isinstance(holder, Mapping) and isinstance(holder.get("seed"), int) \
                and not isinstance(holder.get("seed"), bool):
            return int(holder["seed"])
    return None


def grid_key(path: Sequence[str]) -> str:
    """A grid's key as named in trial values: dotted, without RLlib's ``config.`` prefix."""
    parts = list(path[1:]) if len(path) > 1 and path[0] == "config" else list(path)
    return ".".join(parts)


def expand_grid(data: Mapping[str, Any], num_samples: int = 1, seed: int | None = None
                ) -> list[Trial]:
    """The trials of ``data`` (a config file's mapping, RLlib's experiment wrapper and
    ``num_samples`` removed): the product of every ``grid_search`` (last key fastest),
    repeated ``num_samples`` times. Repeat k's seed is ``seed + k`` where ``seed`` is the
    command line's, else the trial's own ``seed`` key; None when neither is set."""
    if num_samples < 1:
        raise UsageError(f"num_samples must be >= 1, got {num_samples}")
    grids = find_grids(data)
    paths = [path for path, _ in grids]
    trials: list[Trial] = []
    for sample in range(num_samples):
        for point in itertools.product(*(values for _, values in grids)):
            trial_data = copy.deepcopy(dict(data))
            for path, value in zip(paths, point):
                _with_value(trial_data, path, value)
            base = seed if seed is not None else _file_seed(trial_data)
            trials.append(Trial(index=len(trials),
                                values={grid_key(p): v for p, v in zip(paths, point)},
                                sample=sample,
                                seed=None if base is None else base + sample,
                                data=trial_data))
    return trials


def read_sweep(path: str, seed: int | None = None) -> Sweep | None:
    """The sweep in the config file at ``path``; None when the file has no ``grid_search``
    and no ``num_samples`` (an ordinary single run). ``seed``: the ``--seed`` flag."""
    from actorrl.experiment.train import read_config_file_data, unwrap_experiment

    raw = read_config_file_data(path)
    name, data = unwrap_experiment(raw)
    data = dict(data)
    if NUM_SAMPLES_KEY not in data and not find_grids(data):
        return None
    num_samples = data.pop(NUM_SAMPLES_KEY, 1)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise UsageError(f"config file {path!r}: num_samples must be an integer >= 1 (how "
                         f"often each grid point runs), got {num_samples!r}")
    trials = expand_grid(data, num_samples, seed)
    grid_keys = list(trials[0].values) if trials else []
    return Sweep(path=path, name=name or Path(path).stem, num_samples=num_samples,
                 grid_keys=grid_keys, trials=trials)


# ---- names -------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    """A grid value as written in a trial's name (``0.001``, ``[64,64]``, ``CartPole-v1``)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def short_keys(paths: Sequence[str]) -> dict[str, str]:
    """Each dotted grid key's label: its last part, or the whole path where two share it."""
    last = [p.rsplit(".", 1)[-1] for p in paths]
    return {p: (short if last.count(short) == 1 else p) for p, short in zip(paths, last)}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", text).strip("_")


def trial_label(trial: Trial, sweep: Sweep) -> str:
    """``lr=0.001 seed=1``: this trial's grid values (and seed, or repeat)."""
    labels = short_keys(sweep.grid_keys)
    parts = [f"{labels[k]}={format_value(v)}" for k, v in trial.values.items()]
    if trial.seed is not None:
        parts.append(f"seed={trial.seed}")
    elif sweep.num_samples > 1:
        parts.append(f"sample={trial.sample}")
    return " ".join(parts)


def trial_folder_name(trial: Trial, sweep: Sweep, algorithm: str, env: str) -> str:
    """``<algo>_<env>_<key=value>..._seed=S``: grid keys naming the algorithm or the env
    are left out (they are in the prefix)."""
    labels = short_keys(sweep.grid_keys)
    parts = [algorithm, env]
    parts += [f"{labels[k]}={format_value(v)}" for k, v in trial.values.items()
              if k.rsplit(".", 1)[-1] not in NAME_KEYS_IN_PREFIX]
    if trial.seed is not None:
        parts.append(f"seed={trial.seed}")
    elif sweep.num_samples > 1:
        parts.append(f"sample={trial.sample}")
    return "_".join(_safe(p) for p in parts if _safe(p))[:MAX_NAME_CHARS]


def create_sweep_dir(output_dir: str, name: str,
                     when: datetime.datetime | None = None) -> Path:
    """Make ``<output_dir>/<name>_<timestamp>/`` (``_2``... when taken)."""
    when = when or datetime.datetime.now()
    base = f"{_safe(name) or 'sweep'}_{when:%Y-%m-%d_%H-%M-%S}"
    parent = Path(output_dir)
    parent.mkdir(parents=True, exist_ok=True)
    return make_free_folder(parent, base, "sweep")


def create_trial_dir(sweep_dir: Path, name: str) -> RunDirectory:
    """A trial's results folder ``<sweep_dir>/<name>`` (``_2``... when taken)."""
    return RunDirectory.create_named(sweep_dir, name)


# ---- outcomes ----------------------------------------------------------------------------
@dataclass
class TrialOutcome:
    """How one trial ended (a row of ``summary.csv``)."""

    trial: Trial
    label: str
    folder: str = ""
    status: str = STATUS_NOT_STARTED
    exit_code: int | None = None
    final_reward: float | None = None
    best_reward: float | None = None
    timesteps_total: int = 0
    training_iteration: int = 0
    time_s: float = 0.0
    error: str = ""


def sweep_exit_code(outcomes: Sequence[TrialOutcome]) -> int:
    """0 when every trial finished; else the first (in trial order) nonzero trial code."""
    for outcome in outcomes:
        if outcome.exit_code:
            return outcome.exit_code
    return 0


def _number(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.6g}"


def summary_rows(sweep: Sweep, outcomes: Sequence[TrialOutcome]) -> list[dict[str, Any]]:
    """One dict per trial: name, grid values, seed, status and results."""
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {"trial": Path(o.folder).name if o.folder else o.label}
        for key in sweep.grid_keys:
            row[key] = format_value(o.trial.values.get(key))
        row.update({"seed": "" if o.trial.seed is None else o.trial.seed,
                    "status": o.status,
                    "exit_code": "" if o.exit_code is None else o.exit_code,
                    "final_episode_reward_mean": _number(o.final_reward),
                    "best_episode_reward_mean": _number(o.best_reward),
                    "timesteps_total": o.timesteps_total,
                    "training_iteration": o.training_iteration,
                    "time_s": f"{o.time_s:.1f}", "error": o.error})
        rows.append(row)
    return rows


def write_summary(path: Path, sweep: Sweep, outcomes: Sequence[TrialOutcome]) -> None:
    """``summary.csv``: :func:`summary_rows` with a header."""
    rows = summary_rows(sweep, outcomes)
    columns = list(rows[0]) if rows else ["trial"]
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def format_table(sweep: Sweep, outcomes: Sequence[TrialOutcome]) -> str:
    """The summary as an aligned text table."""
    columns = ["trial", "values", "status", "final", "best", "timesteps", "time_s"]
    rows = [[str(o.trial.index + 1), o.label or "-",
             o.status, _number(o.final_reward) or "-", _number(o.best_reward) or "-",
             f"{o.timesteps_total:,}", f"{o.time_s:.1f}"] for o in outcomes]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# ---- running -----------------------------------------------------------------------------
class SweepRunner:
    """Runs planned trials, at most ``concurrency`` at once, on one event loop.

    ``start(trial_index) -> TrainingRun`` makes a trial's run (its results folder created;
    called in a worker thread, as it may contact a coordinator); signals go to every
    running trial and stop later ones from starting.
    """

    def __init__(self, sweep: Sweep, outcomes: list[TrialOutcome],
                 start: Callable[[int], Any], concurrency: int = 1,
                 report: Callable[[TrialOutcome, Any], None] | None = None) -> None:
        self.sweep = sweep
        self.outcomes = outcomes
        self.start = start
        self.concurrency = max(1, concurrency)
        self.report = report
        self.stopping = False
        self.active: dict[int, Any] = {}
        self._signal: int | None = None

    def on_signal(self, signum: int, count: int) -> None:
        """Stop the running trials (first signal: cleanly; second: abort) and start no
        more."""
        self.stopping = True
        self._signal = signum
        for run in list(self.active.values()):
            run.on_signal(signum, count)

    async def run(self) -> None:
        """Run every trial not yet stopped by a signal."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        for index in range(len(self.outcomes)):
            queue.put_nowait(index)

        async def worker() -> None:
            while not self.stopping:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await self._run_one(index)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    async def _run_one(self, index: int) -> None:
        outcome = self.outcomes[index]
        try:
            run = await asyncio.to_thread(self.start, index)
        except Exception as exc:  # e.g. the coordinator went away between trials
            from actorrl.experiment.errors import error_summary

            outcome.status, outcome.exit_code = "failed", 1
            outcome.error = error_summary(exc)
            if self.report is not None:
                self.report(outcome, None)
            return
        outcome.folder = str(run.run_dir.path)
        outcome.status = "running"
        self.active[index] = run
        if self._signal is not None:  # a signal came while the trial was being set up
            run.on_signal(self._signal, 1)
        try:
            summary = await run.run()
        finally:
            self.active.pop(index, None)
        outcome.status, outcome.exit_code = summary.status, summary.exit_code
        outcome.final_reward, outcome.best_reward = summary.last_reward, summary.best_reward
        outcome.timesteps_total = summary.timesteps_total
        outcome.training_iteration = summary.training_iteration
        outcome.time_s, outcome.error = summary.wall_time_s, summary.error
        if self.report is not None:
            self.report(outcome, run)
