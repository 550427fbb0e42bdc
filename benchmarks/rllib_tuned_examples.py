"""RLlib's own tuned example files through ``actorrl train``: how many start unchanged.

    python benchmarks/rllib_tuned_examples.py FOLDER [--plan-only] [--out FILE.json]
                                              [--algorithms IMPALA,A3C,...] [--timeout-s 300]

``FOLDER`` holds RLlib YAML files (a checkout's ``rllib/tuned_examples``, or files saved from
several versions of it: this machine cannot download them). Every experiment of every file
whose ``run`` is one of ``--algorithms`` (default: every algorithm in actorrl's registry) is
written to a file of its own and run as a user would: ``actorrl train --config FILE
--stop-timesteps 1``, with ``--set num_workers=2`` only where the file asks for more than 2
workers, one file at a time, interrupted as Ctrl-C does once the first iteration's result
line appears (the file trains; a sweep's later trials are not run). ``--plan-only``
validates each file (config, stop keys, env built once) without starting actors: seconds
instead of minutes.

Each experiment is ``started`` (an iteration ran and the command exited cleanly; with
``--plan-only``: ``accepted``, the run would start), ``refused``
(exit 2 before anything started: the message names the setting) or ``failed`` (anything
else: a traceback, a timeout, a failure after starting). Prints one JSON object, also
written to ``--out``: the counts, every experiment's status, exit code, wall time, first
error line and warning lines, and the refusals grouped by their first message.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))
WORKER_KEYS = ("num_workers", "num_rollout_workers", "num_env_runners")


def experiments(folder: Path, algorithms: set[str] | None) -> list[tuple[str, str, dict]]:
    """``(file, experiment name, experiment)`` of every experiment of ``algorithms`` (None:
    every experiment that names its algorithm with ``run``)."""
    found = []
    for path in sorted(folder.rglob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if not isinstance(data, dict):
            continue
        for name, experiment in data.items():
            run = isinstance(experiment, dict) and str(experiment.get("run") or "").upper()
            if run and (algorithms is None or run in algorithms):
                found.append((str(path.relative_to(folder)), str(name), experiment))
    return found


def requested_workers(experiment: dict) -> int | None:
    """The largest worker count the experiment names (grid values included)."""
    counts = []
    for scope in (experiment, experiment.get("config") or {}):
        for key in WORKER_KEYS:
            value = scope.get(key)
            if isinstance(value, dict) and "grid_search" in value:
                counts += [v for v in value["grid_search"] if isinstance(v, int)]
            elif isinstance(value, int):
                counts.append(value)
    return max(counts) if counts else None


def first_error(stderr: str) -> str:
    """The error lines of an ``actorrl train`` stderr, joined."""
    lines = [line.strip() for line in stderr.splitlines()]
    errors = [line for line in lines if " error: " in line or line.startswith("- ")]
    return " ".join(errors)[:600]


def plan_only(argv: list[str]) -> tuple[int, str]:
    """``actorrl train`` up to (not including) starting the run: its exit code and stderr."""
    import actorrl.cli.main as cli
    from actorrl.envs import make_env

    def build_env_only(plan: Any, args: Any) -> int:
        make_env(plan.config.env, plan.config.env_config).close()
        return 0

    def plan_trials(sweep: Any, args: Any) -> int:
        from actorrl.experiment.train import config_file_sections

        for trial in sweep.trials:
            build_env_only(cli._plan(args, config_file_sections(sweep.path, trial.data),
                                     trial.seed), args)
        return 0

    cli._train_local, cli._train_sweep = build_env_only, plan_trials
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # a crash is a finding, not the end of the measurement
            code, _ = 1, err.write(f"crash: {type(exc).__name__}: {exc}")
    return code, err.getvalue()


def start_until_first_result(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``actorrl train`` until its first ``result`` line (a finished training iteration:
    it started), then interrupt it as Ctrl-C does (a sweep's later trials are not run);
    its exit code (130 when interrupted), stdout and stderr. -1 after ``timeout_s``."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "actorrl.cli.main", *argv], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("result iter="):
                    proc.send_signal(signal.SIGINT)
                    break
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()) + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            lines += proc.stdout.readlines()
        finally:
            timer.cancel()
        err.seek(0)
        code = -1 if time.monotonic() > deadline and not any(
            line.startswith("result iter=") for line in lines) else proc.returncode
        return code, "".join(lines), err.read()


def run_one(config: Path, workers: int | None, *, plan: bool, timeout_s: float,
            output: str) -> dict[str, Any]:
    """One experiment through ``actorrl train``; its status and evidence."""
    argv = ["train", "--config", str(config), "--stop-timesteps", "1", "--output", output,
            "--progress", "plain"]
    if workers is not None and workers > 2:
        argv += ["--set", "num_workers=2"]
    start = time.monotonic()
    if plan:
        code, stderr = plan_only(argv)
        started = code == 0
    else:
        code, stdout, stderr = start_until_first_result(argv, timeout_s)
        started = code in (0, 130) and bool(re.search(r"^result iter=", stdout, re.M))
    status = ("accepted" if plan else "started") if started else (
        "refused" if code == 2 and "Traceback" not in stderr else "failed")
    return {"status": status, "exit_code": code,
            "wall_s": round(time.monotonic() - start, 1), "error": first_error(stderr),
            "warnings": sorted({line.split("warning: ", 1)[1] for line in stderr.splitlines()
                                if "warning: " in line})}


def main() -> None:
    """Parse arguments, run every experiment, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated run names (default: every registered algorithm)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.algorithms is None:
        from actorrl.algorithms.registry import algorithm_names

        wanted = {name.upper() for name in algorithm_names()}
    else:
        wanted = {a.strip().upper() for a in args.algorithms.split(",")}
    found = experiments(args.folder, wanted)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, (file, name, experiment) in enumerate(found):
            config = Path(scratch) / f"{i}.yaml"
            config.write_text(yaml.safe_dump({name: experiment}))
            outcome = run_one(config, requested_workers(experiment), plan=args.plan_only,
                              timeout_s=args.timeout_s, output=str(Path(scratch) / "runs"))
            results.append({"file": file, "experiment": name, "run": experiment["run"],
                            **outcome})
            print(f"[{i + 1}/{len(found)}] {outcome['status']:8} {file} ({name}) "
                  f"{outcome['error'][:160]}", file=sys.stderr, flush=True)
    counts = Counter(r["status"] for r in results)
    refusals = Counter(re.sub(r"\(config file '[^']*'\)", "", r["error"])[:200].strip()
                       for r in results if r["status"] == "refused")
    summary = {"folder": str(args.folder), "mode": "plan" if args.plan_only else "start",
               "experiments": len(results), **{k: counts.get(k, 0) for k in
                                               ("started", "accepted", "refused", "failed")},
               "refusals": dict(refusals.most_common()), "results": results}
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=1))


if __name__ == "__main__":
    main()
