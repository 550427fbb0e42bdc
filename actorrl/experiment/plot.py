"""``actorrl plot``: learning curves of one or more results folders as a PNG.

Two panels: ``episode_reward_mean`` against ``timesteps_total`` and against wall time
(``time_total_s``), with the min..max band of each iteration shaded (iterations undone by a
restart from an earlier checkpoint left out); several runs overlaid,
each labelled with its folder name. A folder that holds no ``result.jsonl`` but has run
folders inside (``results/``) stands for all of them. A ``.csv`` learning curve written by
``benchmarks/learning.py`` (``docs/results/<algo>-<env>.csv``: env steps, seconds, mean,
min and max return) is drawn the same way, labelled with its file name, so published
curves overlay each other and live runs. Rendering uses matplotlib's Agg
backend, so no display is needed.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from actorrl.experiment.errors import UsageError
from actorrl.experiment.results import RESULT_FILE, current_results, read_results

DEFAULT_PLOT_NAME = "learning_curves.png"


@dataclass(frozen=True)
class Curve:
    """One run's series."""

    label: str
    timesteps: list[int]
    time_s: list[float]
    reward_mean: list[float]
    reward_min: list[float]
    reward_max: list[float]
    custom: dict[str, list[float]]
    """``custom_metrics`` means (``<name>_mean``) by name, NaN where an iteration has none."""


def _as_float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else float("nan")


def load_curve(run_dir: Path) -> Curve:
    """The series of ``run_dir``; :class:`UsageError` when it has no results yet."""
    results = current_results(read_results(run_dir))  # without rolled-back iterations
    if not results:
        raise UsageError(f"{str(run_dir)!r} has no results yet ({RESULT_FILE} is empty)")
    return Curve(
        label=run_dir.name,
        timesteps=[int(r.get("timesteps_total") or 0) for r in results],
        time_s=[_as_float(r.get("time_total_s")) for r in results],
        reward_mean=[_as_float(r.get("episode_reward_mean")) for r in results],
        reward_min=[_as_float(r.get("episode_reward_min")) for r in results],
        reward_max=[_as_float(r.get("episode_reward_max")) for r in results],
        custom={name: [_as_float((r.get("custom_metrics") or {}).get(name)) for r in results]
                for name in dict.fromkeys(k for r in results
                                          for k in (r.get("custom_metrics") or {})
                                          if k.endswith("_mean"))},
    )


def load_csv_curve(path: Path) -> Curve:
    """The series of a learning-curve CSV (``env_steps``, ``seconds``,
    ``episode_reward_mean/min/max`` columns); :class:`UsageError` when it lacks them."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    needed = {"env_steps", "seconds", "episode_reward_mean"}
    if not rows or not needed <= set(rows[0]):
        raise UsageError(f"{str(path)!r} is not a learning curve: it needs the columns "
                         f"{', '.join(sorted(needed))} (benchmarks/learning.py writes them)")

    def column(name: str) -> list[float]:
        return [float(r[name]) if r.get(name) not in (None, "") else float("nan")
                for r in rows]

    return Curve(label=path.stem, timesteps=[int(float(r["env_steps"])) for r in rows],
                 time_s=column("seconds"), reward_mean=column("episode_reward_mean"),
                 reward_min=column("episode_reward_min"),
                 reward_max=column("episode_reward_max"), custom={})


def expand_run_dirs(paths: list[str]) -> list[Path]:
    """Results folders named by ``paths`` (a parent folder stands for the run folders in
    it); :class:`UsageError` for a path that holds none."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.suffix == ".csv" and path.is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise UsageError(f"results folder {raw!r} does not exist")
        if (path / RESULT_FILE).is_file():
            found.append(path)
            continue
        children = sorted(p for p in path.iterdir() if (p / RESULT_FILE).is_file())
        if not children:
            raise UsageError(f"{raw!r} is not a results folder (no {RESULT_FILE}) and holds "
                             "none")
        found.extend(children)
    return found


def default_output(run_dirs: list[Path]) -> Path:
    """Inside the run folder for one run, the current folder for several."""
    if len(run_dirs) == 1 and run_dirs[0].is_dir():
        return run_dirs[0] / DEFAULT_PLOT_NAME
    return Path(DEFAULT_PLOT_NAME)


def plot_runs(paths: list[str], output: str | os.PathLike[str] | None = None,
              title: str | None = None) -> Path:
    """Draw the learning curves of ``paths`` into a PNG; returns its path."""
    run_dirs = expand_run_dirs(paths)
    curves = [load_csv_curve(d) if d.suffix == ".csv" else load_curve(d) for d in run_dirs]
    out = Path(output) if output is not None else default_output(run_dirs)
    if out.suffix.lower() != ".png":
        raise UsageError(f"output {str(out)!r} must end in .png")
    if not out.parent.is_dir():
        raise UsageError(f"output folder {str(out.parent)!r} does not exist")

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    custom_names = list(dict.fromkeys(n for c in curves for n in c.custom))
    rows = 1 + -(-len(custom_names) // 2)
    figure = Figure(figsize=(12, 4.5 * rows), dpi=100)
    grid = figure.subplots(rows, 2, squeeze=False)
    by_steps, by_time = grid[0]
    for curve in curves:
        line, = by_steps.plot(curve.timesteps, curve.reward_mean, label=curve.label)
        by_steps.fill_between(curve.timesteps, curve.reward_min, curve.reward_max,
                              color=line.get_color(), alpha=0.15, linewidth=0)
        by_time.plot(curve.time_s, curve.reward_mean, color=line.get_color(),
                     label=curve.label)
        by_time.fill_between(curve.time_s, curve.reward_min, curve.reward_max,
                             color=line.get_color(), alpha=0.15, linewidth=0)
    by_steps.set_xlabel("timesteps_total (env steps)")
    by_time.set_xlabel("time_total_s (s)")
    for axes in (by_steps, by_time):
        axes.set_ylabel("episode_reward_mean")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="best")
    # One panel per custom metric (callbacks' custom_metrics), against timesteps.
    panels = [axes for row in grid[1:] for axes in row]
    for axes, name in zip(panels, custom_names):
        for curve in curves:
            if name in curve.custom:
                axes.plot(curve.timesteps, curve.custom[name], label=curve.label)
        axes.set_xlabel("timesteps_total (env steps)")
        axes.set_ylabel(f"custom_metrics/{name}")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="best")
    for axes in panels[len(custom_names):]:
        axes.set_visible(False)
    figure.suptitle(title or "learning curves (shaded: episode reward min..max)")
    figure.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.png")
    figure.savefig(tmp, format="png")
    os.replace(tmp, out)
    return out
