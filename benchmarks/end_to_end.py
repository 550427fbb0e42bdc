"""End-to-end: ``actorrl train ALGO --env CartPole-v1`` as a user runs it, per algorithm.

For each algorithm the real CLI runs in a subprocess (plain progress lines on a pipe) with
``--stop-reward 450 --stop-time CAP``. Measured from the moment the command starts:

- ``startup_s``: until the first result line (interpreter, imports, actor processes, first
  training iteration);
- ``solve_time_s`` / ``solve_timesteps``: until the first result with
  ``episode_reward_mean >= 450`` (null when the cap came first; ``best_reward`` says how far
  it got);
- ``peak_rss_mb``: the largest sum of VmRSS over the CLI process and all its descendants,
  sampled from /proc every ``--sample-s`` seconds (shared library pages count once per
  process, as RSS does); ``peak_pss_mb`` is the same with proportional set sizes, which
  splits shared pages between processes and so does not double-count them.

Actors are forked from the fork server by default (``--start-method``); ``--compare-spawn``
runs the first algorithm again with spawned actors, the reference in the same run.

With ``--compare-workers M`` the first algorithm runs a second time with ``M`` workers
(same cap) and the summary adds ``pss_per_extra_worker_mb`` = (peak PSS with M workers -
peak PSS with ``--num-workers``) / (M - num_workers): what each more worker process costs.

Prints one JSON object per run, then a summary object with the machine's load averages
before and after (the machine may be shared; compare runs on equal load).

    python benchmarks/end_to_end.py            # apex, impala, a3c, a2c; 300 s cap each
    python benchmarks/end_to_end.py --quick    # apex only, 60 s cap
    python benchmarks/end_to_end.py --quick --compare-workers 6   # + apex with 6 workers
    python benchmarks/end_to_end.py --quick --compare-spawn       # + apex spawned, as before
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from actorrl.runtime.node.process import descendant_pids  # noqa: E402

ALGORITHMS = ("apex", "impala", "a3c", "a2c")
SOLVED_REWARD = 450.0
EXIT_GRACE_S = 120.0


def process_tree(pid: int) -> set[int]:
    """``pid`` and all its descendants."""
    return {pid} | descendant_pids(pid)


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler:
    """Samples the process tree's summed RSS and PSS in a thread until stopped."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_rss_kb = 0
        self.peak_pss_kb = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        """Begin sampling."""
        self._thread.start()

    def _run(self) -> None:
        while True:
            pids = process_tree(self.pid)
            self.peak_rss_kb = max(self.peak_rss_kb, sum(_status_kb(p, "VmRSS:") for p in pids))
            self.peak_pss_kb = max(self.peak_pss_kb, sum(_pss_kb(p) for p in pids))
            self.peak_processes = max(self.peak_processes, len(pids))
            if self._stop.wait(self.interval_s):  # periodic sampling, not synchronisation
                return

    def stop(self) -> None:
        """Stop and join the sampler."""
        self._stop.set()
        self._thread.join(timeout=10)


def finite(value: Any) -> float | None:
    """``value`` as a float, None when absent or NaN (no episode ended yet): strict JSON."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_result_line(line: str) -> dict[str, str] | None:
    """The ``key=value`` fields of a ``result ...`` progress line, else None."""
    if not line.startswith("result "):
        return None
    return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return None if value is None or value != value else value


def run_algorithm(algorithm: str, cap_s: float, sample_s: float, workdir: Path,
                  num_workers: int, start_method: str = "fork") -> dict:
    """Train ``algorithm`` through the CLI and measure it (see the module docstring)."""
    output = workdir / f"{algorithm}-{num_workers}w-{start_method}"
    stderr_path = workdir / f"{algorithm}-{num_workers}w-{start_method}.stderr"
    command = [sys.executable, "-m", "actorrl.cli.main", "train", algorithm, "--env", "CartPole-v1",
               "--num-workers", str(num_workers), "--start-method", start_method,
               "--stop-reward", str(SOLVED_REWARD), "--stop-time", str(cap_s),
               "--checkpoint-every", "0", "--progress", "plain", "--output", str(output)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.monotonic()
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE, stderr=stderr,
                                text=True, env=env)
    sampler = MemorySampler(proc.pid, sample_s)
    sampler.start()
    watchdog = threading.Timer(cap_s + EXIT_GRACE_S, proc.kill)
    watchdog.start()
    out: dict[str, Any] = {"algorithm": algorithm, "num_workers": num_workers,
                           "start_method": start_method,
                           "cap_s": cap_s, "startup_s": None,
                           "solve_time_s": None, "solve_timesteps": None, "best_reward": None,
                           "iterations": 0}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            fields = parse_result_line(line.strip())
            if fields is None:
                continue
            now = time.monotonic() - started
            out["iterations"] += 1
            if out["startup_s"] is None:
                out["startup_s"] = round(now, 2)
            reward = _number(fields.get("reward_mean"))
            if reward is not None and (out["best_reward"] is None or reward > out["best_reward"]):
                out["best_reward"] = reward
            if reward is not None and reward >= SOLVED_REWARD and out["solve_time_s"] is None:
                out["solve_time_s"] = round(now, 2)
                out["solve_timesteps"] = int(fields["timesteps_total"])
        proc.wait()
    finally:
        watchdog.cancel()
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out["exit_code"] = proc.returncode
    out["total_s"] = round(time.monotonic() - started, 2)
    out["peak_rss_mb"] = round(sampler.peak_rss_kb / 1024, 1)
    out["peak_pss_mb"] = round(sampler.peak_pss_kb / 1024, 1)
    out["peak_processes"] = sampler.peak_processes
    runs = sorted(output.glob("*/run.json"))
    if runs:
        status = json.loads(runs[-1].read_text())
        out["status"] = status.get("status")
        out["stop_reason"] = status.get("stop_reason")
        out["timesteps_total"] = status.get("timesteps_total")
    if proc.returncode != 0:
        out["stderr_tail"] = stderr_path.read_text()[-500:]
    return out


def targets_met(results: list[dict], comparison: dict | None) -> dict[str, bool]:
    """Issue 14's same-host targets, for the runs that measure them: first result within
    3 s, a 2-worker Ape-X run within 450 MB PSS, each extra worker within 60 MB."""
    met = {}
    for r in results:
        if r["start_method"] != "fork":
            continue
        if r["startup_s"] is not None:
            met[f"{r['algorithm']}_startup_s_le_3"] = r["startup_s"] <= 3.0
        if r["algorithm"] == "apex" and r["num_workers"] == 2:
            met["apex_2_workers_peak_pss_mb_le_450"] = r["peak_pss_mb"] <= 450
    if comparison is not None:
        met["pss_per_extra_worker_mb_le_60"] = comparison["pss_per_extra_worker_mb"] <= 60
    return met


def main() -> None:
    """Parse arguments, run the algorithms one after another, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="apex only, 60 s cap")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help="comma-separated list (default: all four)")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="time cap per algorithm (default: 300, 60 with --quick)")
    parser.add_argument("--sample-s", type=float, default=0.25,
                        help="RSS sampling period")
    parser.add_argument("--keep", action="store_true", help="keep the results folders")
    parser.add_argument("--num-workers", type=int, default=2, help="rollout workers (2)")
    parser.add_argument("--compare-workers", type=int, default=None, metavar="M",
                        help="run the first algorithm again with M workers and report the "
                             "PSS each extra worker adds")
    parser.add_argument("--start-method", choices=("fork", "spawn"), default="fork",
                        help="how the CLI starts actor processes (default: fork)")
    parser.add_argument("--compare-spawn", action="store_true",
                        help="also run the first algorithm with --start-method spawn, as the "
                             "reference for startup and memory in the same run")
    args = parser.parse_args()
    algorithms = ["apex"] if args.quick else [a for a in args.algorithms.split(",") if a]
    cap_s = args.cap_s if args.cap_s is not None else (60.0 if args.quick else 300.0)
    workdir = Path(tempfile.mkdtemp(prefix="actorrl-e2e-"))
    load_before = os.getloadavg()
    results = []
    try:
        for algorithm in algorithms:
            result = run_algorithm(algorithm, cap_s, args.sample_s, workdir, args.num_workers,
                                   args.start_method)
            results.append(result)
            print(json.dumps(result), flush=True)
        if args.compare_spawn and args.start_method != "spawn":
            reference = run_algorithm(algorithms[0], cap_s, args.sample_s, workdir,
                                      args.num_workers, "spawn")
            print(json.dumps(reference), flush=True)
        else:
            reference = None
        if args.compare_workers is not None and args.compare_workers != args.num_workers:
            more = run_algorithm(algorithms[0], cap_s, args.sample_s, workdir,
                                 args.compare_workers, args.start_method)
            print(json.dumps(more), flush=True)
            extra = (more["peak_pss_mb"] - results[0]["peak_pss_mb"]) / (
                args.compare_workers - args.num_workers)
            comparison = {"algorithm": algorithms[0], "num_workers": [
                args.num_workers, args.compare_workers], "peak_pss_mb": [
                results[0]["peak_pss_mb"], more["peak_pss_mb"]],
                "pss_per_extra_worker_mb": round(extra, 1)}
        else:
            comparison = None
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"summary": {r["algorithm"]: {k: r.get(k) for k in (
        "num_workers", "startup_s", "solve_time_s", "solve_timesteps", "best_reward",
        "peak_rss_mb", "peak_pss_mb")} for r in results}, "workers_comparison": comparison,
        "spawn_reference": None if reference is None else {k: reference.get(k) for k in (
            "algorithm", "startup_s", "solve_time_s", "peak_rss_mb", "peak_pss_mb")},
        "targets_met": targets_met(results, comparison),
        "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "results_dir": str(workdir) if args.keep else None}), flush=True)


if __name__ == "__main__":
    main()
