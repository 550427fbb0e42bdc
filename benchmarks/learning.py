"""Learning results: how many env steps and minutes a training takes to reach each score.

    python benchmarks/learning.py ALGO --config FILE [--max-minutes M] [--restore RUN_DIR]
                                  [--set KEY=VALUE ...] [--thresholds -15,0,10,18]
                                  [--results DIR] [--out DIR]

Runs ``actorrl train ALGO --config FILE --stop-time M*60`` exactly as a user does (a
subprocess, plain progress lines; the file's own stop criteria apply too), samples the summed
PSS of that command and all its processes every 2 s, then reads the results folder and prints
one JSON object, also written to ``<out>/<algo>-<env id>.json`` (``--out`` defaults to
``docs/results``):

- ``algorithm``, ``env``, ``config`` (the file), ``overrides`` (the ``--set`` values),
  ``runs`` (the results folders, oldest first), ``exit_code`` of ``actorrl train``;
- ``thresholds``: each return threshold mapped to ``{"env_steps": N, "seconds": S}`` at the
  first iteration whose ``episode_reward_mean`` (the mean game score of the last 100
  episodes, RLlib's ``metrics_smoothing_episodes``) reached it, or null;
- ``final_return`` (``episode_reward_mean`` of the last iteration: the last 100 episodes),
  ``best_return`` (the best such mean), ``env_steps``, ``seconds`` (training time, as
  ``time_total_s``), ``env_steps_per_s`` and ``peak_pss_mb`` (largest over the invocations
  this script measured).

Ctrl-C (SIGINT) stops the training as it stops ``actorrl train`` (final checkpoint) and
still writes the summary. A run longer than one sitting continues with ``--restore RUN_DIR``
(the previous results folder; training goes on from its last checkpoint, counters
included) and the same ``--config`` and ``--set`` values (as with ``actorrl train``, they
take precedence over the checkpoint's config). The curve then spans every folder of the
chain: each ``run.json`` names the checkpoint it was restored from.

Beside the JSON go ``<algo>-<env id>.csv`` (the learning curve: env steps, seconds, mean,
min and max return, policy entropy) and ``<algo>-<env id>.png`` drawn by ``actorrl plot``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))

from actorrl.experiment.results import read_results  # noqa: E402
from benchmarks.end_to_end import MemorySampler, finite  # noqa: E402

DEFAULT_THRESHOLDS: dict[str, list[float]] = {
    "Pong": [-15, 0, 10, 18],
    "Breakout": [10, 50, 100, 200, 300],
    "MinAtar/Breakout": [5, 10, 15],
    "MinAtar/SpaceInvaders": [10, 20, 30, 43],
    "MinAtar/Asterix": [2, 5, 10],
    "MinAtar/Freeway": [20, 40, 50],
    "MinAtar/Seaquest": [1, 5, 10],
    "CartPole": [100, 200, 450],
}
"""Return thresholds per env (the first key found in the env id), when none are given."""

RESULTS_IN = re.compile(r"results in (\S+)")


def thresholds_for(env: str) -> list[float]:
    """The default thresholds of ``env`` (see :data:`DEFAULT_THRESHOLDS`); [] if unknown."""
    for key in sorted(DEFAULT_THRESHOLDS, key=len, reverse=True):
        if key in env:
            return DEFAULT_THRESHOLDS[key]
    return []


def run_chain(run_dir: Path) -> list[Path]:
    """``run_dir`` and the results folders it was restored from, oldest first."""
    chain = [run_dir]
    while True:
        try:
            status = json.loads((chain[0] / "run.json").read_text())
        except (OSError, ValueError):
            break
        restored = status.get("restored_from")
        if not restored:
            break
        path = Path(restored)
        parent = path.parent.parent if path.parent.name == "checkpoints" else path
        if not (parent / "result.jsonl").is_file() or parent in chain:
            break
        chain.insert(0, parent)
    return chain


def chained_results(chain: list[Path]) -> list[dict[str, Any]]:
    """The results of every folder of ``chain`` in order; rows of an earlier folder past
    the point the next one was restored at (iterations after its last checkpoint) are
    left out."""
    segments = [read_results(d) for d in chain]
    rows: list[dict[str, Any]] = []
    for index, segment in enumerate(segments):
        later = next((s for s in segments[index + 1:] if s), None)
        cut = later[0]["training_iteration"] if later else math.inf
        rows.extend(r for r in segment if r["training_iteration"] < cut)
    return rows


def _entropy(result: dict[str, Any]) -> float | None:
    learner = result.get("info", {}).get("learner", {})
    stats = next(iter(learner.values()), {}) if learner else {}
    return finite(stats.get("entropy")) if isinstance(stats, dict) else None


def summarize(rows: list[dict[str, Any]], thresholds: list[float]) -> dict[str, Any]:
    """Thresholds reached, final and best return, steps, seconds and speed of ``rows``."""
    reached: dict[str, dict[str, float] | None] = {}
    for threshold in thresholds:
        first = next((r for r in rows if (finite(r.get("episode_reward_mean")) is not None
                                          and r["episode_reward_mean"] >= threshold)), None)
        reached[f"{threshold:g}"] = None if first is None else {
            "env_steps": int(first["timesteps_total"]),
            "seconds": round(float(first["time_total_s"]), 1)}
    means = [m for m in (finite(r.get("episode_reward_mean")) for r in rows) if m is not None]
    last = rows[-1] if rows else {}
    steps = int(last.get("timesteps_total", 0))
    seconds = float(last.get("time_total_s", 0.0))
    return {
        "thresholds": reached,
        "final_return": means[-1] if means else None,
        "best_return": max(means) if means else None,
        "env_steps": steps,
        "seconds": round(seconds, 1),
        "env_steps_per_s": round(steps / seconds, 1) if seconds > 0 else None,
    }


def write_curve(rows: list[dict[str, Any]], path: Path) -> None:
    """The learning curve as CSV, one line per iteration."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["env_steps", "seconds", "episode_reward_mean", "episode_reward_min",
                         "episode_reward_max", "episodes_total", "entropy"])
        episodes = 0
        for r in rows:
            episodes += int(r.get("episodes_this_iter") or 0)
            writer.writerow([r["timesteps_total"], round(float(r["time_total_s"]), 1),
                             finite(r.get("episode_reward_mean")),
                             finite(r.get("episode_reward_min")),
                             finite(r.get("episode_reward_max")), episodes, _entropy(r)])


def train(args: argparse.Namespace, results_root: Path) -> tuple[Path, float, int]:
    """Run ``actorrl train``; its results folder, peak PSS in MB and exit code."""
    command = [sys.executable, "-m", "actorrl.cli.main", "train", args.algo, "--config",
               args.config, "--output", str(results_root), "--progress", "plain",
               "--stop-time", str(int(args.max_minutes * 60))]
    if args.restore:
        command += ["--restore", args.restore]
    for override in args.set:
        command += ["--set", override]
    # Its own session: a terminal's Ctrl-C reaches only this script, which passes it on
    # once (a second SIGINT would make actorrl train abort without its final checkpoint).
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    memory = MemorySampler(process.pid, 2.0)
    memory.start()
    run_dir: Path | None = None
    assert process.stdout is not None
    try:
        while True:
            try:
                for line in process.stdout:
                    sys.stderr.write(line)
                    found = RESULTS_IN.search(line)
                    if run_dir is None and found:
                        run_dir = Path(found.group(1))
                break
            except KeyboardInterrupt:  # Ctrl-C: the training checkpoints and stops
                process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        memory.stop()
        if process.poll() is None:
            process.kill()
    if run_dir is None:
        raise SystemExit(f"actorrl train exited {process.returncode} before naming its "
                         "results folder")
    return run_dir, memory.peak_pss_kb / 1024, code


def main() -> None:
    """Train, then print and write the learning summary (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algo")
    parser.add_argument("--config", required=True, help="config file (examples/*.yaml)")
    parser.add_argument("--max-minutes", type=float, default=75.0,
                        help="training time of this invocation (default 75)")
    parser.add_argument("--restore", help="continue the chain ending in this results folder")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--thresholds", help="comma-separated returns (default: per env)")
    parser.add_argument("--results", default=str(REPO / "results" / "learning"),
                        help="parent of the results folders (default results/learning)")
    parser.add_argument("--out", default=str(REPO / "docs" / "results"),
                        help="where the JSON, CSV and PNG go (default docs/results)")
    args = parser.parse_args()
    # Started in the background (nohup ... &), SIGINT is ignored; Ctrl-C and kill -INT
    # should still stop the training cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    run_dir, peak_pss_mb, code = train(args, Path(args.results))
    config = json.loads((run_dir / "config.json").read_text())
    env = str(config["env"])
    thresholds = ([float(t) for t in args.thresholds.split(",")] if args.thresholds
                  else thresholds_for(env))
    chain = run_chain(run_dir)
    rows = chained_results(chain)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.algo}-{env.replace('/', '_')}"
    previous_pss = 0.0  # the earlier part of the chain, as this script measured it
    try:
        previous = json.loads((out_dir / f"{stem}.json").read_text())
    except (OSError, ValueError):
        previous = {}
    if len(chain) > 1 and str(chain[-2]) in previous.get("runs", []):
        previous_pss = float(previous.get("peak_pss_mb") or 0.0)
    summary = {
        "algorithm": args.algo, "env": env, "config": args.config, "overrides": args.set,
        "runs": [str(d) for d in chain], "exit_code": code,
        **summarize(rows, thresholds),
        "peak_pss_mb": round(max(peak_pss_mb, previous_pss), 1),
    }
    write_curve(rows, out_dir / f"{stem}.csv")
    subprocess.run([sys.executable, "-m", "actorrl.cli.main", "plot", *map(str, chain), "-o",
                    str(out_dir / f"{stem}.png")], cwd=REPO, check=False,
                   stdout=subprocess.DEVNULL)
    text = json.dumps(summary, indent=2)
    (out_dir / f"{stem}.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
