"""Recurrent policies: what the LSTM costs in env steps/s, and what it learns.

Prints one JSON object. In the same run, IMPALA with and without ``use_lstm`` on CartPole-v1
and on Pong (``examples/pong-impala.yaml`` and ``examples/pong-impala-lstm.yaml``), each
trained for a fixed time through ``actorrl train`` as a user runs it: env steps/s after
the first result (start-up excluded), and ``lstm_over_ff_cartpole`` /
``lstm_over_ff_pong``, the LSTM's rate over the feed-forward one (aim: >= 0.7). Then
``examples/stateless-cartpole-impala-lstm.yaml`` trains until a mean return of 150:
``stateless_steps_to_150`` and ``stateless_seconds_to_150`` (null if not reached in the
cap).

    python benchmarks/recurrent.py [--quick]       # --quick: under 5 minutes
    python benchmarks/recurrent.py --quick --only cartpole   # one part (others null)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] == str(Path(__file__).resolve().parent):
    sys.path.pop(0)  # this folder's transport.py would shadow the transport package
sys.path.insert(0, str(REPO))

from actorrl.experiment.results import read_results  # noqa: E402
from benchmarks.end_to_end import finite  # noqa: E402

CARTPOLE = ["--env", "CartPole-v1", "--set", "num_envs_per_worker=4",
            "--set", "rollout_fragment_length=20", "--set", "train_batch_size=160",
            "--set", "model={\"fcnet_hiddens\": [64]}"]
CARTPOLE_LSTM = ["--set", "model={\"fcnet_hiddens\": [64], \"use_lstm\": true, "
                 "\"lstm_cell_size\": 64, \"max_seq_len\": 20}"]


PARTS = ("cartpole", "pong", "stateless")
"""The benchmark's parts, in the order they run (``--only`` picks some)."""


def train(args: list[str], seconds: float, workdir: Path, stop_reward: str = "none"
          ) -> list[dict[str, Any]]:
    """``actorrl train impala ARGS`` for ``seconds`` of training; its results."""
    output = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "actorrl.cli", "train", "impala", *args,
               "--stop-time", str(seconds), "--stop-reward", stop_reward,
               "--output", str(output), "--progress", "plain", "--checkpoint-every", "0"]
    subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=seconds + 240, check=False)
    [run] = [d for d in output.iterdir() if d.is_dir()]
    return read_results(run)


def steps_per_s(results: list[dict[str, Any]]) -> float | None:
    """Env steps/s from the first result to the last (the start-up left out)."""
    if len(results) < 2:
        return None
    first, last = results[0], results[-1]
    seconds = last["time_total_s"] - first["time_total_s"]
    return (last["timesteps_total"] - first["timesteps_total"]) / seconds if seconds else None


def first_reaching(results: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """The first result whose mean return reached ``threshold``."""
    for result in results:
        reward = finite(result.get("episode_reward_mean"))
        if reward is not None and reward >= threshold:
            return result
    return None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` rounded, or None when either is missing."""
    return round(numerator / denominator, 3) if numerator and denominator else None


def main() -> None:
    """Run the comparison and print the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="under 5 minutes")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only this part (repeatable); the others' keys are null")
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    cartpole_s, pong_s, stateless_cap_s = (25, 40, 100) if args.quick else (60, 120, 300)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="recurrent-bench-") as tmp:
        work = Path(tmp)
        rates: dict[str, float | None] = dict.fromkeys(
            ("cartpole_ff", "cartpole_lstm", "pong_ff", "pong_lstm"))
        if "cartpole" in parts:
            rates["cartpole_ff"] = steps_per_s(train(CARTPOLE, cartpole_s, work))
            rates["cartpole_lstm"] = steps_per_s(train(CARTPOLE + CARTPOLE_LSTM, cartpole_s,
                                                       work))
        if "pong" in parts:
            rates["pong_ff"] = steps_per_s(train(["--config", "examples/pong-impala.yaml"],
                                                 pong_s, work))
            rates["pong_lstm"] = steps_per_s(train(
                ["--config", "examples/pong-impala-lstm.yaml"], pong_s, work))
        stateless = train(["--config", "examples/stateless-cartpole-impala-lstm.yaml"],
                          stateless_cap_s, work, stop_reward="150") \
            if "stateless" in parts else []
    reached = first_reaching(stateless, 150.0)
    print(json.dumps({
        "benchmark": "recurrent",
        "quick": args.quick,
        "parts": [part for part in PARTS if part in parts],
        "env_steps_per_s": {k: round(v, 1) if v else None for k, v in rates.items()},
        "lstm_over_ff_cartpole": ratio(rates["cartpole_lstm"], rates["cartpole_ff"]),
        "lstm_over_ff_pong": ratio(rates["pong_lstm"], rates["pong_ff"]),
        "target_lstm_over_ff": 0.7,
        "stateless_steps_to_150": reached["timesteps_total"] if reached else None,
        "stateless_seconds_to_150": round(reached["time_total_s"], 1) if reached else None,
        "stateless_best_return": max((r for r in (finite(x.get("episode_reward_mean"))
                                                  for x in stateless) if r is not None),
                                     default=None),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "elapsed_s": round(time.perf_counter() - started, 1),
    }))


if __name__ == "__main__":
    main()
