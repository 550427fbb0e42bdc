"""RLlib's tuned example files against their own bars: does actorrl learn what RLlib learns?

    python benchmarks/rllib_learning.py FOLDER [--out FILE.json] [--cap-s 300] [--only GLOB]
                                        [--experiment GLOB] [--max-hours 1] [--probe-s 90]
                                        [--plan-only] [--runs-dir DIR]

``FOLDER`` holds RLlib YAML files: tuned examples (``rllib/tuned_examples``) and release
learning tests (``release/rllib_tests/learning_tests/yaml_files``, which carry
``pass_criteria``), either as a checkout's folders or saved from several versions as
``FOLDER/<commit>/<path in RLlib's repository>`` (this machine cannot download them; a
``manifest.txt`` of ``path commit`` lines may sit beside them). ``--only`` keeps the files
whose path matches a glob (``'*cartpole-ppo*'``; repeatable), ``--skip`` drops those that
match one, and ``--experiment`` keeps the experiments whose name matches a glob (one test of
a file that holds many, as the release tests' ``hard_learning_tests.yaml``; repeatable).

Each experiment's bar is its own: the reward of its ``stop`` (RLlib stops a trial at the
first criterion met, so a reward reached before the ``timesteps_total`` budget passes) or
of its ``pass_criteria`` (RLlib's release tests), read here as that reward within that
many env steps. RLlib's own harness (``run_learning_tests_from_yaml``, Ray 2.7) is looser:
it stops a release test at the reward or at its ``stop`` (``time_total_s``, on RLlib's
GPU machines) and judges the best reward alone; ``timesteps_total`` there sets a minimum
throughput (those env steps within ``time_total_s``) whose check RLlib turned off. The env
steps are the budget here because a 2-core machine's seconds say nothing of RLlib's.
Each runs as a user would, ``actorrl train --config FILE --stop-time CAP`` (the file
written unchanged but for ``--set num_workers=2`` where it asks for more than 2 workers,
the first trial of a sweep, and a release test's ``pass_criteria`` as its ``stop``), one
file at a time; the rewards and env steps come from the ``result.jsonl`` it writes.

Outcomes:

- ``passed``: the bar's reward reached; at what env steps, training seconds, wall seconds.
- ``failed``: not reached; the best reward and at what env steps, whether the budget was
  spent or the wall-clock cap (``--cap-s``) cut the run, and the learner's stats
  (entropy, kl, losses...) at the best and the last iteration, to find the cause.
- ``not run`` with the reason: an algorithm actorrl lacks, no reward bar (a memory-leak or
  throughput test), a setting or env actorrl refuses (``actorrl train``'s own message:
  env not installable, an unknown key...), or a budget beyond a 2-core machine: env steps
  that cannot finish within ``--max-hours`` at the env steps/s a ``--probe-s`` run of the
  file measured (Atari budgets above what 2 cores step even with random actions are not
  probed).

Prints one JSON object (counts and every experiment), also written to ``--out``.
``--plan-only`` classifies without training (not run / to run), in seconds.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
if sys.path[0] == str(HERE):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))

from rllib_tuned_examples import (  # noqa: E402  (after the path set-up above)
    experiments,
    first_error,
    plan_only,
    requested_workers,
)

from actorrl.algorithms.stop import REWARD_KEY, TIMESTEPS_KEY, lookup  # noqa: E402
from actorrl.config.aliases import resolve_rllib_keys, resolve_stop_keys  # noqa: E402
from actorrl.envs.retired import current_env_id, is_mujoco_id  # noqa: E402
from actorrl.experiment.sweep import NUM_SAMPLES_KEY, expand_grid  # noqa: E402

REPO = HERE.parent
EVAL_REWARD_KEY = "evaluation.episode_reward_mean"
TIME_KEY = "time_total_s"
ITERATION_KEY = "training_iteration"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ATARI = re.compile(r"(NoFrameskip|Deterministic)-v[04]$|(^|:)ALE/")
ATARI_MAX_STEPS_PER_S = 4000.0
"""Atari env steps/s two cores manage at best: ~2,000 per core stepping a preprocessed
Pong env with random actions, no learning (docs/benchmarks.md); a budget that cannot
finish in time at this pace is not probed."""
LEARNER_STATS = ("entropy", "kl", "policy_loss", "vf_loss", "vf_explained_var", "total_loss",
                 "mean_q", "mean_td_error", "cur_lr", "cur_kl_coeff", "grad_gnorm",
                 "var_gnorm", "pi_loss")


# ---- the bar ---------------------------------------------------------------------------------
def bar_of(experiment: dict[str, Any]) -> dict[str, Any] | None:
    """The experiment's bar: ``{"key", "reward", "timesteps", "source"}`` (``timesteps`` None
    without a budget), from ``pass_criteria`` (release tests; the budget from its
    ``timesteps_total``, else the stop's) or else ``stop``; None without a reward."""
    stop = _resolved(experiment.get("stop"))
    criteria = _resolved(experiment.get("pass_criteria"))
    for source, mapping in (("pass_criteria", criteria), ("stop", stop)):
        for key in (REWARD_KEY, EVAL_REWARD_KEY):
            if isinstance(mapping.get(key), (int, float)):
                budget = mapping.get(TIMESTEPS_KEY, stop.get(TIMESTEPS_KEY))
                return {"key": key, "reward": float(mapping[key]), "source": source,
                        "timesteps": int(budget) if isinstance(budget, (int, float)) else None,
                        "iterations": stop.get(ITERATION_KEY), "time_s": stop.get(TIME_KEY)}
    return None


def _resolved(mapping: Any) -> dict[str, Any]:
    """A stop-like mapping with RLlib 2.x paths read as actorrl's keys; {} when unusable."""
    if not isinstance(mapping, dict):
        return {}
    try:
        return resolve_stop_keys(mapping)
    except ValueError:
        return {}


def first_trial(experiment: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The experiment with every ``grid_search`` at its first value and without
    ``num_samples``; how many trials the file has."""
    data = {k: v for k, v in experiment.items() if k != NUM_SAMPLES_KEY}
    samples = experiment.get(NUM_SAMPLES_KEY, 1)
    trials = expand_grid(data)
    samples = samples if isinstance(samples, int) and samples > 0 else 1
    return trials[0].data, len(trials) * samples


def runnable_file(experiment: dict[str, Any], bar: dict[str, Any]) -> dict[str, Any]:
    """What is written for ``actorrl train``: the first trial, with a release test's
    ``pass_criteria`` as its ``stop`` (reward and budget)."""
    data, _ = first_trial(experiment)
    if "pass_criteria" in data:
        data.pop("pass_criteria")
        stop = {bar["key"]: bar["reward"]}
        if bar["timesteps"] is not None:
            stop[TIMESTEPS_KEY] = bar["timesteps"]
        data["stop"] = stop
    return data


def env_run(env: Any) -> str | None:
    """The env actorrl's loader runs for a retired id (``Pendulum-v0`` -> ``Pendulum-v1``,
    ``HalfCheetah-v2`` -> ``-v5``); None when the id stands."""
    if not isinstance(env, str):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        current = current_env_id(env)
    return current if current != env else None


def env_of(experiment: dict[str, Any]) -> Any:
    """The experiment's env (top level or its ``config``)."""
    config = experiment.get("config") if isinstance(experiment.get("config"), dict) else {}
    return experiment.get("env", config.get("env"))


def classify(experiment: dict[str, Any], algorithms: set[str]) -> str | None:
    """Why the experiment is not run before anything is tried (None: try it)."""
    run = str(experiment.get("run", "")).upper()
    if run not in algorithms:
        return f"algorithm missing: actorrl has no {experiment.get('run')}"
    if bar_of(experiment) is None:
        stop = experiment.get("stop")
        return f"no reward bar: its stop ({json.dumps(stop)}) names no episode reward"
    return None


def is_heavy(env: Any) -> bool:
    """Whether ``env`` is an Atari or MuJoCo env (budgets sized for RLlib's clusters)."""
    return isinstance(env, str) and bool(ATARI.search(env) or is_mujoco_id(env_run(env) or env))


def budget_reason(env: Any, bar: dict[str, Any], max_s: float,
                  workers: int | None) -> str | None:
    """For an Atari or MuJoCo env: why its budget cannot finish within ``max_s`` on this
    machine, before anything runs (no env-step budget and a time budget beyond ``max_s``
    or none; an Atari budget beyond :data:`ATARI_MAX_STEPS_PER_S`); None when it might."""
    if not is_heavy(env):
        return None
    where = f" on {workers} workers" if workers else ""
    if bar["timesteps"] is None and (bar["time_s"] is None or bar["time_s"] > max_s):
        within = f"within {bar['time_s']:,.0f} s" if bar["time_s"] else "with no limit"
        return (f"budget beyond a 2-core machine: no env-step budget; the bar is a reward of "
                f"{bar['reward']:g} {within}{where} of RLlib's")
    if bar["timesteps"] is not None and ATARI.search(env):
        fastest_s = bar["timesteps"] / ATARI_MAX_STEPS_PER_S
        if fastest_s > max_s:
            return (f"budget beyond a 2-core machine: {bar['timesteps']:,} env steps take at "
                    f"least {fastest_s / 3600:.1f} h on 2 cores (<= "
                    f"{ATARI_MAX_STEPS_PER_S:,.0f} Atari env steps/s even with random actions, "
                    "no learning)")
    return None


# ---- reading a run ---------------------------------------------------------------------------
def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """The result dicts of every ``result.jsonl`` under ``run_dir`` (a sweep's first trial
    only ever runs here), in order."""
    rows: list[dict[str, Any]] = []
    for path in sorted(run_dir.rglob("result.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill
    return rows


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def learner_stats(result: dict[str, Any]) -> dict[str, float]:
    """The learner's scalar stats of one result (per policy for multi-agent: ``pol.kl``)."""
    learner = lookup(result, "info.learner") or {}
    out: dict[str, float] = {}

    def take(stats: dict[str, Any], prefix: str) -> None:
        for key in LEARNER_STATS:
            value = _num(stats.get(key))
            if value is not None:
                out[prefix + key] = float(f"{value:.4g}")

    take(learner, "")
    for name, stats in learner.items():
        if isinstance(stats, dict):
            take(stats, f"{name}.")
    return out


def outcome_of(rows: list[dict[str, Any]], bar: dict[str, Any]) -> dict[str, Any]:
    """``passed`` with where the bar was first reached, or ``failed`` with the best reward
    and where, the learner's stats at the best and last iteration and a short curve."""
    key = bar["key"]
    points = [(r, _num(lookup(r, key))) for r in rows]
    points = [(r, v) for r, v in points if v is not None]
    last = rows[-1] if rows else {}
    steps = int(last.get(TIMESTEPS_KEY) or 0)
    figures: dict[str, Any] = {
        "env_steps_total": steps, "training_s": round(float(last.get(TIME_KEY) or 0.0), 1),
        "env_steps_per_s": round(steps / last[TIME_KEY]) if last.get(TIME_KEY) else None}
    for result, value in points:
        if value >= bar["reward"]:
            return {"outcome": "passed", "reward": round(value, 2),
                    "env_steps": int(result.get(TIMESTEPS_KEY) or 0),
                    "seconds": round(float(result.get(TIME_KEY) or 0.0), 1), **figures}
    out: dict[str, Any] = {"outcome": "failed", **figures}
    if points:
        best, best_value = max(points, key=lambda p: p[1])
        out.update(best_reward=round(best_value, 2),
                   best_at_env_steps=int(best.get(TIMESTEPS_KEY) or 0),
                   last_reward=round(points[-1][1], 2),
                   learner_at_best=learner_stats(best), learner_at_last=learner_stats(last))
        stride = max(1, len(points) // 10)
        out["curve"] = [[int(r.get(TIMESTEPS_KEY) or 0), round(v, 1)]
                        for r, v in points[::stride]]
    else:
        out.update(best_reward=None, best_at_env_steps=None)
    out["budget_spent"] = any(
        limit is not None and value >= limit for value, limit in (
            (steps, bar["timesteps"]), (int(last.get(ITERATION_KEY) or 0), bar.get("iterations")),
            (float(last.get(TIME_KEY) or 0.0), bar.get("time_s"))))
    return out


# ---- running -----------------------------------------------------------------------------------
def run_train(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """``actorrl train`` to its end (interrupted as Ctrl-C does after ``timeout_s``, killed a
    minute later): exit code and stderr."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "actorrl.cli.main", *argv], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err.seek(0)
        return proc.returncode, err.read()


def train_argv(config: Path, experiment: dict[str, Any], output: Path, stop_time_s: float
               ) -> list[str]:
    """``actorrl train``'s arguments for one written experiment file."""
    argv = ["train", "--config", str(config), "--output", str(output), "--progress", "plain",
            "--stop-time", f"{stop_time_s:g}", "--checkpoint-every", "0"]
    workers = requested_workers(experiment)
    if workers is not None and workers > 2:
        argv += ["--set", "num_workers=2"]
    return argv


def probe_rate(config: Path, data: dict[str, Any], work: Path, probe_s: float,
               rates: dict[tuple[str, str], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Env steps/s of the experiment's algorithm on its env: measured by a ``probe_s`` run
    of the file, or taken from an earlier probe of the same algorithm and env (``rates``);
    None when the probe finished no iteration."""
    key = (str(data.get("run")).upper(), str(env_of(data)))
    if key not in rates:
        start = time.monotonic()
        run_train(train_argv(config, data, work / "probe", probe_s), probe_s + 300)
        rates[key] = None
        pace = probe_pace(read_results(work / "probe"))
        if pace:
            rates[key] = {"env_steps_per_s": round(pace), "measured_by": str(config),
                          "wall_s": round(time.monotonic() - start, 1)}
    return rates[key]


def probe_pace(rows: list[dict[str, Any]]) -> float | None:
    """Env steps/s of a probe's last iteration (a replay algorithm's first iterations
    sample without learning, far faster than it trains later); the whole run's when it
    finished only one; None when it finished none."""
    if len(rows) >= 2:
        steps = rows[-1][TIMESTEPS_KEY] - rows[-2][TIMESTEPS_KEY]
        seconds = float(rows[-1][TIME_KEY]) - float(rows[-2][TIME_KEY])
        if steps > 0 and seconds > 0:
            return steps / seconds
    if rows and rows[-1].get(TIME_KEY):
        return rows[-1][TIMESTEPS_KEY] / rows[-1][TIME_KEY]
    return None


def run_experiment(data: dict[str, Any], bar: dict[str, Any], *, work: Path, cap_s: float,
                   probe_s: float, max_s: float, plan: bool, long_runs: bool = True,
                   rates: dict[tuple[str, str], dict[str, Any] | None] | None = None
                   ) -> dict[str, Any]:
    """Plan, (probe,) and run one written experiment; its outcome record. An Atari or
    MuJoCo experiment with an env-step budget is probed first: not run when the budget
    would take longer than ``max_s`` at the measured pace; otherwise its cap is the
    estimate plus a fifth (at most ``max_s``), or with ``long_runs`` false it is not run."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "experiment.yaml"
    config.write_text(yaml.safe_dump({"experiment": data}))
    code, stderr = plan_only(train_argv(config, data, work / "plan", cap_s))
    warnings_ = sorted({line.split("warning: ", 1)[1] for line in stderr.splitlines()
                        if "warning: " in line})
    if code != 0:
        return {"outcome": "not run",
                "reason": f"actorrl train refuses it: {first_error(stderr) or stderr[-300:]}",
                "warnings": warnings_}
    if plan:
        return {"outcome": "to run", "warnings": warnings_}
    if bar["timesteps"] is not None and is_heavy(env_of(data)):
        probe = probe_rate(config, data, work, probe_s, {} if rates is None else rates)
        if probe is None:
            return {"outcome": "not run", "warnings": warnings_, "reason": (
                f"budget beyond a 2-core machine: a {probe_s:g} s run of the file finished "
                f"no training iteration, so {bar['timesteps']:,} env steps are out of reach")}
        if probe:
            estimate_s = bar["timesteps"] / probe["env_steps_per_s"]
            pace = (f"{bar['timesteps']:,} env steps at the {probe['env_steps_per_s']:,} env "
                    f"steps/s a {probe_s:g} s run measured take {estimate_s / 3600:.1f} h")
            if estimate_s > max_s:
                return {"outcome": "not run", "warnings": warnings_, "probe": probe,
                        "reason": f"budget beyond a 2-core machine: {pace}"}
            if not long_runs:
                return {"outcome": "not run", "warnings": warnings_, "probe": probe,
                        "reason": f"within a 2-core machine's hour but not run here: {pace}"}
            cap_s = min(max_s, max(cap_s, 1.2 * estimate_s))
    start = time.monotonic()
    code, stderr = run_train(train_argv(config, data, work / "run", cap_s), cap_s + 300)
    wall_s = round(time.monotonic() - start, 1)
    rows = read_results(work / "run")
    if not rows:
        return {"outcome": "not run", "warnings": warnings_, "wall_s": wall_s,
                "reason": f"no iteration finished (exit {code}): "
                          f"{first_error(stderr) or stderr.strip()[-300:]}"}
    record = outcome_of(rows, bar)
    if record["outcome"] == "failed" and not record["budget_spent"]:
        record["capped"] = f"the {cap_s:g} s cap stopped it at {record['env_steps_total']:,}" \
            + (f" of {bar['timesteps']:,} env steps" if bar["timesteps"] else " env steps")
    return {**record, "exit_code": code, "wall_s": wall_s, "warnings": warnings_,
            "run_dir": str(work / "run")}


# ---- files ---------------------------------------------------------------------------------
def origin(relative: str, manifest: dict[str, str]) -> tuple[str, str | None]:
    """The RLlib path and commit of a file found at ``relative`` under the folder."""
    parts = relative.split("/", 1)
    if len(parts) == 2 and COMMIT.match(parts[0]):
        return parts[1], parts[0]
    return relative, manifest.get(relative)


def read_manifest(folder: Path) -> dict[str, str]:
    """``path -> commit`` from the folder's ``manifest.txt`` (``path commit`` lines)."""
    path = folder / "manifest.txt"
    if not path.exists():
        return {}
    pairs = [line.split() for line in path.read_text().splitlines()]
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def canonical(experiment: dict[str, Any]) -> str:
    """The experiment as actorrl runs it, as text: run, env (as the loader maps it), bar and
    config with RLlib's other spellings read as actorrl's keys and the keys actorrl ignores
    (``framework``, API-stack switches...) dropped. Versions of a file that differ only in
    those are one experiment here and run once."""
    config = experiment.get("config") if isinstance(experiment.get("config"), dict) else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values = resolve_rllib_keys(config, algorithm=str(experiment.get("run")).lower(),
                                        env_known=False).values
        except Exception:  # an algorithm the alias table does not know: compare as written
            values = config
    env = env_of(experiment)
    return json.dumps({"run": str(experiment.get("run")).upper(), "env": env_run(env) or env,
                       "bar": bar_of(experiment), "trials": experiment.get(NUM_SAMPLES_KEY),
                       "config": values}, sort_keys=True, default=str)


def key_of(record: dict[str, Any]) -> tuple[str, str | None, str]:
    """What identifies an experiment across runs: its file, commit and name."""
    return record["file"], record["commit"], record["experiment"]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by outcome, and the not-run reasons grouped by their kind."""
    counts = Counter(r["outcome"] for r in results)
    reasons = Counter(r["reason"].split(":", 1)[0] for r in results
                      if r["outcome"] == "not run")
    return {"experiments": len(results),
            **{k: counts.get(k, 0) for k in ("passed", "failed", "not run", "to run")},
            "not_run_because": dict(reasons.most_common())}


FAMILIES = (("multi-agent CartPole", r"MultiAgentCartPole"), ("RepeatAfterMe", r"RepeatAfterMe"),
            ("StatelessCartPole", r"StatelessCartPole"), ("CartPole", r"CartPole"),
            ("Pendulum", r"Pendulum"), ("FrozenLake", r"FrozenLake"),
            ("Acrobot / MountainCar", r"Acrobot|MountainCar"), ("Atari", ATARI.pattern),
            ("PyBullet", r"BulletEnv"),
            ("MuJoCo", r"HalfCheetah|Hopper|Walker2d|Humanoid|Ant-|Swimmer|Reacher"),
            ("RandomEnv (memory-leak tests)", r"RandomEnv|RandomLargeObsSpaceEnv"))


def family(env: Any) -> str:
    """The env family a result is counted under in the table (a grid of envs: its first)."""
    if isinstance(env, dict) and isinstance(env.get("grid_search"), list) and env["grid_search"]:
        env = env["grid_search"][0]
    for name, pattern in FAMILIES:
        if re.search(pattern, str(env)):
            return name
    return "other"


def markdown_table(summary: dict[str, Any]) -> str:
    """Counts by env family and outcome, as the docs' table (``--table``; the docs' copy,
    ``docs/results/rllib-learning.json``, lists the records as ``experiments_list``)."""
    by_family: dict[str, Counter[str]] = {}
    for record in summary.get("results", summary.get("experiments_list", [])):
        by_family.setdefault(family(record["env"]), Counter())[record["outcome"]] += 1
    order = [name for name, _ in FAMILIES] + ["other"]
    lines = ["| env | experiments | passed | failed | not run |", "|---|---|---|---|---|"]
    for name in sorted(by_family, key=order.index):
        c = by_family[name]
        lines.append(f"| {name} | {sum(c.values())} | {c['passed']} | {c['failed']} | "
                     f"{c['not run']} |")
    lines.append(f"| **all** | {summary['experiments']} | **{summary['passed']}** | "
                 f"{summary['failed']} | {summary['not run']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run every experiment in scope, print and write the JSON."""
    from actorrl.algorithms.registry import algorithm_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cap-s", type=float, default=300.0,
                        help="wall-clock cap of one file's training (default 300)")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB")
    parser.add_argument("--skip", action="append", default=[], metavar="GLOB")
    parser.add_argument("--experiment", action="append", default=[], metavar="GLOB",
                        help="keep only the experiments whose name matches")
    parser.add_argument("--max-hours", type=float, default=1.0,
                        help="budgets that need longer on this machine are not run")
    parser.add_argument("--probe-s", type=float, default=90.0)
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--no-long-runs", action="store_true",
                        help="probe Atari/MuJoCo budgets but run none of them in full")
    parser.add_argument("--resume", type=Path, metavar="FILE.json",
                        help="keep the outcomes an earlier --out file measured (same file, "
                             "commit and experiment) and run only the others")
    parser.add_argument("--runs-dir", type=Path,
                        help="where the runs' results folders stay (default: a new temp dir)")
    parser.add_argument("--table", action="store_true",
                        help="FOLDER is a results JSON (--out): print its counts as markdown")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.folder.read_text())))
        return
    algorithms = {name.upper() for name in algorithm_names()}
    manifest = read_manifest(args.folder)
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="rllib-learning-"))
    found = [item for item in experiments(args.folder, None)
             if (not args.only or any(fnmatch.fnmatch(item[0], g) for g in args.only))
             and not any(fnmatch.fnmatch(item[0], g) for g in args.skip)
             and (not args.experiment
                  or any(fnmatch.fnmatch(item[1], g) for g in args.experiment))]
    earlier = {key_of(r): r for r in json.loads(args.resume.read_text())["results"]
               if r["outcome"] != "to run"} if args.resume else {}
    results: list[dict[str, Any]] = []
    rates: dict[tuple[str, str], dict[str, Any] | None] = {}
    measured: dict[str, dict[str, Any]] = {}
    for i, (relative, name, experiment) in enumerate(found):
        path, commit = origin(relative, manifest)
        if (path, commit, name) in earlier:
            results.append(earlier[(path, commit, name)])
            if results[-1]["outcome"] in ("passed", "failed") \
                    and "same_run_as" not in results[-1]:
                measured.setdefault(canonical(experiment), results[-1])
            continue
        bar = bar_of(experiment)
        env = env_of(experiment)
        record: dict[str, Any] = {"file": path, "commit": commit, "experiment": name,
                                  "run": experiment.get("run"), "env": env, "bar": bar}
        try:
            _, trials = first_trial(experiment)
        except Exception as exc:  # a malformed grid: actorrl train would refuse it too
            trials, reason = 1, f"actorrl train refuses it: {exc}"
        else:
            reason = classify(experiment, algorithms) or (
                budget_reason(env, bar, args.max_hours * 3600, requested_workers(experiment))
                if bar else None)
        if trials > 1:
            record["trials"] = f"the first of {trials} trials runs"
        if reason:
            record.update(outcome="not run", reason=reason)
        else:
            if env_run(env):
                record["env_run"] = env_run(env)
            twin = measured.get(canonical(experiment))
        if not reason and twin is not None:
            record.update({k: v for k, v in twin.items() if k not in record and k != "env_run"},
                          same_run_as=f"{twin['file']}@{twin['commit']} ({twin['experiment']})")
        elif not reason:
            record.update(run_experiment(runnable_file(experiment, bar), bar,
                                         work=runs_dir / f"{i:03d}", cap_s=args.cap_s,
                                         probe_s=args.probe_s, max_s=args.max_hours * 3600,
                                         plan=args.plan_only, long_runs=not args.no_long_runs,
                                         rates=rates))
        results.append(record)
        if not reason and "same_run_as" not in record and record["outcome"] != "to run":
            measured.setdefault(canonical(experiment), record)
        if args.out:
            write_summary(args, runs_dir, results)
        shown = {k: record.get(k) for k in ("reward", "best_reward", "env_steps",
                                            "best_at_env_steps", "seconds") if k in record}
        print(f"[{i + 1}/{len(found)}] {record['outcome']:8} {path}@{(commit or '')[:10]} "
              f"({name}) {shown or record.get('reason', '')}", file=sys.stderr, flush=True)
    print(json.dumps(write_summary(args, runs_dir, results), indent=1))


def write_summary(args: argparse.Namespace, runs_dir: Path, results: list[dict[str, Any]]
                  ) -> dict[str, Any]:
    """The JSON of the runs so far, written to ``--out`` when given (after every
    experiment, so an interrupted run can ``--resume``)."""
    summary = {"measured": time.strftime("%Y-%m-%d"), "folder": str(args.folder),
               "cap_s": args.cap_s, "max_hours": args.max_hours, "runs_dir": str(runs_dir),
               **summarize(results), "results": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
