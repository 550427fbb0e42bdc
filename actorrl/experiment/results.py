"""The results folder of one training run, and the writers that fill it.

::

    <output>/<algo>_<env>_<YYYY-mm-dd_HH-MM-SS>/
        run.json            status (running/finished/interrupted/failed), stop reason, error,
                            best reward, counters, paths; rewritten atomically on each change
        config.json         the resolved algorithm config (every key, RLlib names)
        result.jsonl        one result dict per training iteration (RLlib keys, nested)
        progress.csv        the same, flattened with "/" ("info/learner_queue/size_mean")
        events.out.tfevents.*   TensorBoard scalars (x axis: timesteps_total)
        checkpoints/checkpoint_<iteration>/   see :mod:`actorrl.algorithms.checkpoints`
        logs/               one log per actor process, plus driver.log

The folder is created only after every input has been validated, so bad input never
leaves a folder behind; a run that fails later says so in ``run.json``. Whole-file
rewrites (``run.json``, ``config.json``, a widened ``progress.csv``) go through
:func:`actorrl.util.files.atomic_write`.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from actorrl.algorithms.checkpoints import CHECKPOINTS_DIR
from actorrl.util.files import atomic_write, atomic_write_json, jsonable

RUN_FILE = "run.json"
CONFIG_FILE = "config.json"
PROGRESS_FILE = "progress.csv"
RESULT_FILE = "result.jsonl"
LOGS_DIR = "logs"

STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"
STATUS_INTERRUPTED = "interrupted"
STATUS_FAILED = "failed"

TENSORBOARD_KEYS = (
    "episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean",
    "episodes_this_iter", "timesteps_total", "num_steps_trained", "time_this_iter_s",
    "num_healthy_workers",
)
"""Top-level result keys written as TensorBoard scalars (plus :func:`derived_metrics`)."""
SECTION_SCALARS = ("custom_metrics", "evaluation")
"""Result sections whose every number is a TensorBoard scalar (``custom_metrics/x_mean``,
``evaluation/episode_reward_mean``)."""


def to_json_line(result: dict[str, Any]) -> str:
    """One result dict as one line of strict JSON."""
    return json.dumps(jsonable(result), allow_nan=False, separators=(",", ":"))


def flatten_result(result: dict[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested dicts joined into ``"a/b/c"`` keys (as RLlib's CSV logger); lists become
    JSON text, non-finite floats stay floats."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        elif isinstance(value, (list, tuple, np.ndarray)):
            flat[prefix] = json.dumps(jsonable(value))
        elif isinstance(value, np.generic):
            flat[prefix] = value.item()
        else:
            flat[prefix] = value

    walk("", result)
    return flat


def derived_metrics(result: dict[str, Any], previous: dict[str, Any] | None
                    ) -> dict[str, float]:
    """Per-iteration rates computed from consecutive results: ``env_steps_per_s``,
    ``trained_steps_per_s`` and, when the pipeline reports one, ``learner_queue_size``
    (mean in-queue length)."""
    time_s = float(result.get("time_this_iter_s") or 0.0)
    out: dict[str, float] = {}
    if time_s > 0:
        out["env_steps_per_s"] = float(result.get("timesteps_this_iter", 0)) / time_s
        trained_before = int(previous.get("num_steps_trained", 0)) if previous else None
        if trained_before is not None:
            trained = int(result.get("num_steps_trained", 0)) - trained_before
            out["trained_steps_per_s"] = max(0, trained) / time_s
    queue = (result.get("info") or {}).get("learner_queue")
    if isinstance(queue, dict) and isinstance(queue.get("size_mean"), (int, float)):
        out["learner_queue_size"] = float(queue["size_mean"])
    return out


def rollback_step(result: dict[str, Any], previous: dict[str, Any] | None) -> int | None:
    """When ``result`` is the first after a rollback (a restart from an earlier checkpoint:
    its ``training_iteration`` is not above the previous result's), the first
    ``timesteps_total`` it supersedes (the checkpoint's plus one); None otherwise."""
    if previous is None:
        return None
    iteration, before = result.get("training_iteration"), previous.get("training_iteration")
    if not (isinstance(iteration, int) and isinstance(before, int)) or iteration > before:
        return None
    start = int(result.get("timesteps_total") or 0) - int(result.get("timesteps_this_iter")
                                                          or 0)
    return max(start, 0) + 1


def current_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` without the rows a later rollback superseded: after a restart from an
    earlier checkpoint, the iterations that were done again replace the lost ones (the
    rows stay in ``result.jsonl``; ``actorrl plot`` draws these)."""
    kept: list[dict[str, Any]] = []
    floor = math.inf
    for result in reversed(results):
        iteration = result.get("training_iteration")
        if isinstance(iteration, (int, float)):
            if iteration >= floor:
                continue
            floor = iteration
        kept.append(result)
    return kept[::-1]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "env"


def make_free_folder(parent: Path, base: str, what: str) -> Path:
    """Make ``<parent>/<base>/``, or ``<base>_2``, ``<base>_3``... when the name is taken
    (``what`` names the folder's kind in the error when no name is free)."""
    for attempt in range(1, 1000):
        path = parent / (base if attempt == 1 else f"{base}_{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"could not find a free {what} folder name for {base}")


class RunDirectory:
    """One run's results folder; create it with :meth:`create` once inputs are valid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._status: dict[str, Any] = {}

    @classmethod
    def create(cls, output_dir: str | os.PathLike[str], algorithm: str, env: str,
               when: datetime.datetime | None = None) -> RunDirectory:
        """Make ``<output_dir>/<algorithm>_<env>_<timestamp>/`` (``_2``, ``_3``... when the
        name is taken) with its ``logs/`` and ``checkpoints/`` folders."""
        when = when or datetime.datetime.now()
        parent = Path(output_dir)
        parent.mkdir(parents=True, exist_ok=True)
        return cls.create_named(parent, f"{algorithm}_{_safe_name(env)}_{when:%Y-%m-%d_%H-%M-%S}")

    @classmethod
    def create_named(cls, parent: Path, base: str) -> RunDirectory:
        """Make ``<parent>/<base>/`` (``_2``, ``_3``... when the name is taken) with its
        ``logs/`` and ``checkpoints/`` folders."""
        path = make_free_folder(parent, base, "results")
        (path / LOGS_DIR).mkdir()
        (path / CHECKPOINTS_DIR).mkdir()
        return cls(path)

    @property
    def logs_dir(self) -> Path:
        """Actor and driver logs."""
        return self.path / LOGS_DIR

    @property
    def checkpoints_dir(self) -> Path:
        """Where ``checkpoint_<iteration>/`` folders go."""
        return self.path / CHECKPOINTS_DIR

    def write_config(self, config: dict[str, Any]) -> None:
        """Write the resolved config as ``config.json``."""
        atomic_write_json(self.path / CONFIG_FILE, config)

    def update_status(self, **fields: Any) -> None:
        """Merge ``fields`` into ``run.json`` and rewrite it atomically."""
        self._status.update(fields)
        self._status["updated_at"] = time.time()
        atomic_write_json(self.path / RUN_FILE, self._status)


def _summary_writer_class() -> type:
    """tensorboardX's ``SummaryWriter``, imported without torch when torch is not loaded
    yet: tensorboardX treats torch as optional, and importing it would add seconds and
    ~190 MB to a driver process that otherwise never needs torch."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` fail
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class ResultWriter:
    """Appends each iteration's result to ``result.jsonl``, ``progress.csv`` and the
    TensorBoard event file of a results folder. Small writes: fine on the event loop."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.run_dir = run_dir
        self._jsonl = open(run_dir / RESULT_FILE, "a")  # noqa: SIM115 (closed in close())
        self._csv_path = run_dir / PROGRESS_FILE
        self._csv_columns: list[str] = []
        self._previous: dict[str, Any] | None = None
        self._rollbacks = 0
        self._tb = None
        if tensorboard:
            self._tb = _summary_writer_class()(logdir=str(run_dir), flush_secs=10)

    def record(self, result: dict[str, Any]) -> dict[str, float]:
        """Write ``result`` everywhere; returns its :func:`derived_metrics`."""
        derived = derived_metrics(result, self._previous)
        purge = rollback_step(result, self._previous)
        if purge is not None and self._tb is not None:
            # TensorBoard hides what a restart undid: a writer opened with purge_step
            # supersedes the earlier events at and after that step.
            self._tb.close()
            self._rollbacks += 1
            self._tb = _summary_writer_class()(
                logdir=str(self.run_dir), flush_secs=10, purge_step=purge,
                filename_suffix=f".rollback{self._rollbacks}")  # a file of its own
        self._previous = result
        self._jsonl.write(to_json_line(result) + "\n")
        self._jsonl.flush()
        self._append_csv(flatten_result(result))
        if self._tb is not None:
            step = int(result.get("timesteps_total", 0))
            for key in TENSORBOARD_KEYS:
                value = result.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, global_step=step)
            for section in SECTION_SCALARS:
                for key, value in flatten_result(result.get(section) or {}).items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        self._tb.add_scalar(f"{section}/{key}", value, global_step=step)
            for key, value in derived.items():
                self._tb.add_scalar(f"throughput/{key}" if key.endswith("_per_s")
                                    else f"info/{key}", value, global_step=step)
            self._tb.flush()
        return derived

    def _append_csv(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self._csv_columns]
        if new and self._csv_columns:
            self._rewrite_csv_with(self._csv_columns + new)
        elif new:
            self._csv_columns = list(row)
            with open(self._csv_path, "w", newline="") as f:
                csv.DictWriter(f, self._csv_columns).writeheader()
        with open(self._csv_path, "a", newline="") as f:
            csv.DictWriter(f, self._csv_columns, restval="").writerow(row)

    def _rewrite_csv_with(self, columns: list[str]) -> None:
        """A key appeared that earlier rows lack (stats that start late): rewrite the file
        with the wider header, earlier rows left empty in the new columns."""
        with open(self._csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self._csv_path, text.getvalue())
        self._csv_columns = columns

    def close(self) -> None:
        """Flush and close every file."""
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_results(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The result dicts of a results folder, from ``result.jsonl`` (a torn last line,
    from a run killed mid-write, is skipped)."""
    path = Path(run_dir) / RESULT_FILE
    results = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                results.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return results
